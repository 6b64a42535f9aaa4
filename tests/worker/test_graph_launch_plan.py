"""An eager step takes the launches its CUDA graph bucket would (worker/cuda_graphs.py,
DecodeGraphs.eager_metadata), so turning graphs off, or a step that misses its graph, never
changes a step's numbers: a decode step sizes its split-KV for the padded batch, a small step
with prompt tokens takes the prefill graph's one general launch, a larger step is left as it is.
The buckets are shapes only: nothing here is captured, so it runs on the CPU."""

from __future__ import annotations

import torch

from ladle.attention.metadata import AttentionMetadata
from ladle.worker.cuda_graphs import DecodeGraphs, graph_batch_sizes, padded_batch_size


def _buckets(max_batch_size: int = 64, prefill_max_tokens: int = 1024) -> DecodeGraphs:
    def forward(*_):  # never called: nothing is captured
        raise AssertionError("a launch plan must not run the model")

    return DecodeGraphs(
        forward,
        max_batch_size=max_batch_size,
        max_blocks_per_seq=64,
        block_size=16,
        device=torch.device("cpu"),
        prefill_max_tokens=prefill_max_tokens,
    )


def _metadata(query_lens: list[int]) -> AttentionMetadata:
    starts = [0]
    for length in query_lens:
        starts.append(starts[-1] + length)
    seq_lens = [length + 7 for length in query_lens]
    return AttentionMetadata(
        slot_mapping=torch.zeros(starts[-1], dtype=torch.long),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.zeros((len(query_lens), 4), dtype=torch.int32),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_size=16,
        query_start_loc_host=starts,
        seq_lens_host=seq_lens,
    )


def test_uncaptured_buckets_never_replay():
    buckets = _buckets()
    assert not buckets.captured
    assert not buckets.can_run(num_reqs=3, num_tokens=3, max_query_len=1, width=4)
    assert not buckets.can_run(num_reqs=3, num_tokens=40, max_query_len=38, width=4)


def test_decode_step_sizes_its_splits_for_the_padded_batch():
    buckets = _buckets()
    for num_reqs in (1, 3, 7, 9, 41, 64):
        metadata = buckets.eager_metadata(_metadata([1] * num_reqs), num_reqs)
        padded = padded_batch_size(num_reqs, graph_batch_sizes(64))
        assert metadata.launch_num_reqs == padded >= num_reqs
        assert not metadata.graph_launches


def test_small_mixed_step_takes_the_prefill_graph_launches():
    buckets = _buckets()
    # Ten decodes beside one prompt chunk of 200 tokens: the (256, 16) bucket holds it, and the
    # eager launch is sized as the graph's (its split-KV factor follows the bucket's tiles).
    metadata = buckets.eager_metadata(_metadata([1] * 10 + [200]), 210)
    assert metadata.graph_launches
    assert (metadata.launch_num_tokens, metadata.launch_num_reqs) == (256, 16)
    # The original is untouched (the same step may be built again by a caller).
    assert not _metadata([1] * 10 + [200]).graph_launches


def test_steps_past_every_bucket_keep_the_eager_launches():
    buckets = _buckets(prefill_max_tokens=512)
    metadata = _metadata([1] * 4 + [600])  # 604 tokens: above the largest token bucket
    assert buckets.eager_metadata(metadata, 604) is metadata
    decodes = _metadata([1] * 65)  # a decode batch above the largest decode bucket ...
    plan = buckets.eager_metadata(decodes, 65)
    # ... still fits a prefill bucket (128 requests within 512 tokens): the graph launches.
    assert plan.graph_launches


def test_no_prefill_buckets_without_a_prefill_budget():
    buckets = _buckets(prefill_max_tokens=0)
    metadata = _metadata([1] * 2 + [30])
    assert buckets.eager_metadata(metadata, 32) is metadata
