"""Which steps' prompts take SDPA instead of the paged kernel (attention/fresh_prefill.py): only
long prompts with no cached context, few of them, after any leading decodes, never for a graph's
template metadata. Host values only; the GPU test checks the outputs."""

from __future__ import annotations

import torch

from ladle.attention.fresh_prefill import MAX_FRESH_PROMPTS, fresh_prompt_spans
from ladle.attention.metadata import AttentionMetadata


def _metadata(lengths: list[tuple[int, int]], for_graph: bool = False) -> AttentionMetadata:
    starts = [0]
    for query_len, _ in lengths:
        starts.append(starts[-1] + query_len)
    seq_lens = [seq_len for _, seq_len in lengths]
    empty = torch.zeros(0, dtype=torch.int32)
    return AttentionMetadata(
        slot_mapping=empty,
        query_start_loc=empty,
        seq_lens=empty,
        block_tables=empty,
        max_query_len=max(q for q, _ in lengths),
        max_seq_len=max(seq_lens),
        block_size=16,
        query_start_loc_host=starts,
        seq_lens_host=seq_lens,
        for_graph=for_graph,
    )


def test_long_fresh_prompts_after_leading_decodes():
    metadata = _metadata([(1, 40), (1, 9), (600, 600), (600, 600)])
    assert fresh_prompt_spans(metadata, 2) == [(2, 602), (602, 1202)]
    assert fresh_prompt_spans(_metadata([(1, 40), (8192, 8192)]), 1) == [(1, 8193)]


def test_refused_cases():
    assert fresh_prompt_spans(_metadata([(600, 616)]), 0) is None  # a cached prefix
    assert fresh_prompt_spans(_metadata([(600, 600), (511, 511)]), 0) is None  # a short one
    assert fresh_prompt_spans(_metadata([(600, 600), (512, 512)]), 0) is None  # two lengths
    assert fresh_prompt_spans(_metadata([(600, 600)], for_graph=True), 0) is None
    many = [(512, 512)] * (MAX_FRESH_PROMPTS + 1)
    assert fresh_prompt_spans(_metadata(many), 0) is None
    assert fresh_prompt_spans(_metadata([(1, 40)]), 1) is None  # nothing after the decodes
