"""Which steps' prompt takes SDPA instead of the paged kernel (attention/fresh_prefill.py): only
one long prompt with no cached context, after any leading decodes, never for a graph's template
metadata. Host values only; the GPU test checks the outputs."""

from __future__ import annotations

import torch

from ladle.attention.fresh_prefill import fresh_prompt_span
from ladle.attention.metadata import AttentionMetadata


def _metadata(lengths: list[tuple[int, int]], graph_launches: bool = False) -> AttentionMetadata:
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
        graph_launches=graph_launches,
    )


def test_one_long_fresh_prompt_after_leading_decodes():
    assert fresh_prompt_span(_metadata([(1, 40), (1, 9), (600, 600)]), 2) == (2, 602)
    assert fresh_prompt_span(_metadata([(512, 512)]), 0) == (0, 512)


def test_refused_cases():
    assert fresh_prompt_span(_metadata([(600, 616)]), 0) is None  # a cached prefix
    assert fresh_prompt_span(_metadata([(511, 511)]), 0) is None  # a short one
    assert fresh_prompt_span(_metadata([(600, 600)], graph_launches=True), 0) is None
    assert fresh_prompt_span(_metadata([(600, 600)] * 2), 0) is None  # several prompts
    assert fresh_prompt_span(_metadata([(600, 600), (1, 30)]), 0) is None  # a decode after it
    assert fresh_prompt_span(_metadata([(1, 40)]), 1) is None  # nothing after the decodes
