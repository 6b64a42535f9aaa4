"""Which captured prefill graph a step with prompt tokens replays (worker/prefill_graphs.py):
the smallest bucket that holds the step's tokens plus one token per padding request, with at
least one padding request (it takes the tokens the bucket adds)."""

from __future__ import annotations

import pytest

from ladle.worker.prefill_graphs import (
    PREFILL_TOKEN_BUCKETS,
    graph_worthy_tokens,
    largest_prefill_bucket,
    prefill_bucket,
    request_buckets_for,
)

TOKENS = (16, 32, 64, 128, 512, 640)
REQUESTS = (2, 4, 8)


@pytest.mark.parametrize(
    ("num_tokens", "num_reqs", "expected"),
    [
        (1, 1, (16, 2)),  # one request: one padding request, 15 padding tokens
        (15, 1, (16, 2)),
        (16, 1, (32, 2)),  # no room left for the padding request's token in 16
        (512, 1, (640, 2)),
        (100, 2, (128, 4)),  # two real requests: padded to four, two padding requests
        (126, 2, (128, 4)),
        (127, 2, (512, 4)),  # 129 tokens: the next bucket here is 512
        (30, 7, (32, 8)),  # one padding request of one token
        (639, 1, (640, 2)),
        (640, 1, None),  # 640 + 1 fits no bucket: eager
        (10, 8, None),  # no request bucket above 8: eager
    ],
)
def test_prefill_bucket(num_tokens, num_reqs, expected):
    assert prefill_bucket(num_tokens, num_reqs, TOKENS, REQUESTS) == expected


def test_largest_prefill_bucket_follows_the_step_budget():
    assert largest_prefill_bucket(8192) == (8192, 8)
    assert largest_prefill_bucket(3000) == (2048, 8)
    assert largest_prefill_bucket(1000) == (896, 8)
    assert largest_prefill_bucket(8) is None
    # With the decode batch's request buckets: the most requests the largest token bucket
    # holds beside one token per padding request.
    assert largest_prefill_bucket(8192, request_buckets_for(256)) == (8192, 512)
    assert largest_prefill_bucket(1000, request_buckets_for(256)) == (896, 256)


@pytest.mark.parametrize(
    ("max_requests", "expected"),
    [(1, (2,)), (7, (2, 4, 8)), (8, (2, 4, 8, 16)), (256, (2, 4, 8, 16, 32, 64, 128, 256, 512))],
)
def test_request_buckets_reach_past_the_decode_batch(max_requests, expected):
    """A mixed step of max_requests (decodes beside a prompt chunk) still has a bucket with a
    padding request."""
    buckets = request_buckets_for(max_requests)
    assert buckets == expected
    assert prefill_bucket(max_requests + 40, max_requests, (16, 2048), buckets) is not None


def test_a_full_batch_beside_a_short_chunk_takes_a_captured_bucket():
    """255 decodes and a 100-token chunk pad to 512 requests, and so to a token bucket with room
    for them (a (640, 512) bucket is never captured)."""
    tokens = (16, 32, 64, 128, 256, 384, 512, 640, 768, 896, 1024, 1536, 2048)
    assert prefill_bucket(355, 256, tokens, request_buckets_for(256)) == (1024, 512)


class _NoReplay:
    def replay(self) -> None:
        pass


def test_replay_lays_out_the_padding_requests():
    """What a replay feeds the captured graph (on the CPU, with the replay itself stubbed out):
    the real rows, then padding requests sharing the rest of the bucket's tokens evenly, all
    writing the null block and reading no real request's blocks."""
    import torch

    from ladle.attention.metadata import AttentionMetadata
    from ladle.worker.prefill_graphs import PrefillGraphs

    graphs = PrefillGraphs(
        forward=None,
        max_blocks_per_seq=8,
        block_size=16,
        device=torch.device("cpu"),
        max_num_tokens=64,
        token_buckets=(16, 32, 64),
        request_buckets=(2, 4, 8),
    )
    graphs.static = graphs._allocate_static()  # what capture() does first
    # Stale values from an earlier replay must not survive where padding goes.
    graphs.static.slot_mapping.fill_(99)
    graphs.static.block_tables.fill_(7)
    bucket = (32, 8)
    graphs._graphs[bucket] = _NoReplay()
    graphs._outputs[bucket] = torch.arange(32.0).unsqueeze(1)
    # Five requests: a decode, a 10-token chunk after 20 cached tokens, three short prompts.
    seq_lens = [40, 30, 3, 4, 2]  # query lengths 1, 10, 3, 4, 2
    starts = [0, 1, 11, 14, 18, 20]
    metadata = AttentionMetadata(
        slot_mapping=torch.arange(100, 120),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.arange(1, 16, dtype=torch.int32).view(5, 3),
        max_query_len=10,
        max_seq_len=40,
        block_size=16,
        query_start_loc_host=starts,
        seq_lens_host=seq_lens,
    )
    assert graphs.bucket_for(5, 20, 3) == bucket  # 20 tokens + 3 padding requests <= 32
    hidden = graphs.run(bucket, torch.arange(1, 21), torch.arange(20), metadata)
    static = graphs.static
    assert torch.equal(hidden, torch.arange(20.0).unsqueeze(1))
    # Padding requests 5, 6 and 7 share the other 12 of the 32 tokens: 4 each.
    assert static.query_start_loc.tolist() == [0, 1, 11, 14, 18, 20, 24, 28, 32]
    assert static.seq_lens.tolist() == [40, 30, 3, 4, 2, 4, 4, 4]
    assert static.input_ids[:20].tolist() == list(range(1, 21))
    assert static.input_ids[20:32].tolist() == [0] * 12
    assert static.slot_mapping[:20].tolist() == list(range(100, 120))
    assert static.slot_mapping[20:32].tolist() == [0] * 12  # the null block
    assert static.block_tables[:5, :3].tolist() == metadata.block_tables.tolist()
    assert static.block_tables[5:].tolist() == [[0] * 8] * 3


def _layer_params(num_layers, hidden, q_width, kv_width, intermediate):
    per_layer = hidden * (q_width + 2 * kv_width) + q_width * hidden + 3 * hidden * intermediate
    return num_layers * per_layer


def test_graphs_stop_where_the_gpu_outlasts_the_launches():
    # Qwen3-0.6B: a step of the whole 8192-token budget still launches for longer than its
    # GEMMs run, so a busy server's mixed steps of 2,000-4,000 tokens (decodes beside two
    # arrivals' prompts) get graphs.
    small = graph_worthy_tokens(28, _layer_params(28, 1024, 2048, 1024, 3072))
    assert small > 8192
    # Llama-3.1-8B: ~1,100 tokens of GEMMs outlast the launches; no graph above 1024 tokens.
    large = graph_worthy_tokens(32, _layer_params(32, 4096, 4096, 1024, 14336))
    assert 1024 <= large < 1536
    assert largest_prefill_bucket(min(8192, large), request_buckets_for(256)) == (1024, 512)
    # More layers per weight (a deeper, narrower model) means more launches for the same work.
    assert abs(graph_worthy_tokens(56, _layer_params(28, 1024, 2048, 1024, 3072)) - 2 * small) <= 1
    assert PREFILL_TOKEN_BUCKETS[-1] == 8192


def _reachable_buckets(graphs, max_num_seqs: int, max_num_tokens: int) -> set[tuple[int, int]]:
    """The buckets that the steps with prompt tokens replay: every shape of R <= max_num_seqs
    requests and T tokens, R < T <= max_num_tokens (T == R is a decode step: decode graphs).
    Tokens above the largest bucket fit none, so the enumeration stops there."""
    width = graphs.max_blocks_per_seq
    largest = max(graphs.token_buckets, default=0)
    reached = set()
    for num_reqs in range(1, max_num_seqs + 1):
        for num_tokens in range(num_reqs + 1, min(max_num_tokens, largest) + 1):
            bucket = graphs.bucket_for(num_reqs, num_tokens, width)
            if bucket is None:
                continue
            padded_tokens, padded_reqs = bucket
            # The bucket holds the step and one token for each of its padding requests.
            assert padded_reqs > num_reqs
            assert padded_tokens >= num_tokens + padded_reqs - num_reqs
            reached.add(bucket)
    return reached


@pytest.mark.parametrize(
    ("max_num_seqs", "max_num_tokens", "max_model_len", "expected_count"),
    [
        # The defaults on the 0.6B shape (max_model_len far above the step budget, and every
        # token bucket graph-worthy): 118 prefill graphs.
        (256, 8192, 40960, 118),
        (256, 8192, 131072, 118),
        # The 8B shape: graph_worthy_tokens caps the token buckets at ~1,100 (test above).
        (256, 1100, 131072, 73),
        (64, 2048, 4096, 81),
        (5, 100, 256, 9),  # budget 100: token buckets up to 64, request buckets 2, 4, 8
        (1, 8192, 300, 5),  # max_model_len 300: token buckets up to 256, one request bucket
    ],
)
def test_every_captured_bucket_is_reachable_and_every_reachable_step_is_captured(
    max_num_seqs, max_num_tokens, max_model_len, expected_count
):
    """The captured set is exactly what steps replay: nothing is captured that no step of the
    scheduler's limits can use, and every step shape that fits a bucket finds it captured (so
    the set cannot shrink without sending some step to another graph or to eager)."""
    import torch

    from ladle.worker.prefill_graphs import PrefillGraphs

    block_size = 16
    graphs = PrefillGraphs(
        forward=None,
        max_blocks_per_seq=-(-max_model_len // block_size),
        block_size=block_size,
        device=torch.device("cpu"),
        max_num_tokens=min(max_num_tokens, max_model_len),
        request_buckets=request_buckets_for(max_num_seqs),
    )
    assert len(graphs.buckets) == expected_count
    reached = _reachable_buckets(graphs, max_num_seqs, min(max_num_tokens, max_model_len))
    assert reached == set(graphs.buckets)


def test_padding_tokens_are_shared_out_evenly_with_the_remainder_first():
    """13 padding tokens over 3 padding requests: 5, 4, 4 (never one request holding them all,
    whose attention would grow with the square of the padding)."""
    import torch

    from ladle.attention.metadata import AttentionMetadata
    from ladle.worker.prefill_graphs import PrefillGraphs

    graphs = PrefillGraphs(
        forward=None, max_blocks_per_seq=8, block_size=16, device=torch.device("cpu"),
        max_num_tokens=64, token_buckets=(16, 32, 64), request_buckets=(2, 4, 8),
    )
    graphs.static = graphs._allocate_static()
    bucket = (32, 8)
    graphs._graphs[bucket] = _NoReplay()
    graphs._outputs[bucket] = torch.zeros(32, 1)
    starts = [0, 4, 8, 12, 16, 19]  # five prompts, 19 tokens
    seq_lens = [4, 4, 4, 4, 3]
    metadata = AttentionMetadata(
        slot_mapping=torch.arange(19), query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.ones(5, 1, dtype=torch.int32), max_query_len=4, max_seq_len=4,
        block_size=16, query_start_loc_host=starts, seq_lens_host=seq_lens,
    )
    graphs.run(bucket, torch.arange(19), torch.arange(19), metadata)
    assert graphs.static.query_start_loc.tolist() == [0, 4, 8, 12, 16, 19, 24, 28, 32]
    assert graphs.static.seq_lens.tolist() == [4, 4, 4, 4, 3, 5, 4, 4]
