"""The Triton paged attention and cache write against the torch reference.

On a GPU: awkward query lengths, cached prefixes, prefill/decode mixes, GQA ratios, dtypes, block
sizes, split-KV decode. Without a GPU: the same checks at tiny sizes on the Triton interpreter, in
a child process (TRITON_INTERPRET must be set before triton is first imported).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_CUDA = torch.cuda.is_available() and not INTERPRET
HAS_TRITON = importlib.util.find_spec("triton") is not None
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 5e-3, torch.float32: 2e-3}

needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


@dataclass
class Case:
    """One attention step: per request (query_len, seq_len) and the model's head shapes."""

    lengths: list[tuple[int, int]]
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16
    num_padding_tokens: int = 0
    num_splits: int | None = None
    block_n: int | None = None
    block_rows: int | None = None


def build_step(case: Case, device: str, generator: torch.Generator):
    """Random cache (every block, so stale data is never zero), shuffled block ids, metadata."""
    from ladle.attention.metadata import AttentionMetadata

    block_size = case.block_size
    blocks_per_req = [(seq_len + block_size - 1) // block_size for _, seq_len in case.lengths]
    num_blocks = sum(blocks_per_req) + 4  # block 0 is the null block
    block_ids = (torch.randperm(num_blocks - 1, generator=generator) + 1).tolist()
    max_blocks = max(blocks_per_req) + 2  # padded columns point at the null block
    block_tables = torch.zeros(len(case.lengths), max_blocks, dtype=torch.int32)
    slots, query_starts = [], [0]
    for index, ((query_len, seq_len), count) in enumerate(zip(case.lengths, blocks_per_req)):
        assert 0 <= query_len <= seq_len
        table = [block_ids.pop() for _ in range(count)]
        block_tables[index, :count] = torch.tensor(table, dtype=torch.int32)
        for position in range(seq_len - query_len, seq_len):
            slots.append(table[position // block_size] * block_size + position % block_size)
        query_starts.append(query_starts[-1] + query_len)
    slots += [0] * case.num_padding_tokens  # padding tokens write the null block
    num_tokens = len(slots)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(case.dtype).to(device)

    kv_cache = randn(2, num_blocks, block_size, case.num_kv_heads, case.head_dim)
    query = randn(num_tokens, case.num_heads, case.head_dim)
    key = randn(num_tokens, case.num_kv_heads, case.head_dim)
    value = randn(num_tokens, case.num_kv_heads, case.head_dim)
    seq_lens_host = [seq_len for _, seq_len in case.lengths]
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(query_starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens_host, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        max_query_len=max(query_len for query_len, _ in case.lengths),
        max_seq_len=max(seq_lens_host),
        block_size=block_size,
        query_start_loc_host=query_starts,
        seq_lens_host=seq_lens_host,
    )
    return query, key, value, kv_cache, metadata


def check_case(case: Case, device: str, seed: int = 0) -> None:
    from ladle.attention.base import write_kv_cache
    from ladle.attention.torch_backend import paged_attention_reference
    from ladle.attention.triton_backend import TritonAttentionBackend
    from ladle.kernels.paged_attention import LaunchConfig, paged_attention

    generator = torch.Generator().manual_seed(seed)
    query, key, value, kv_cache, metadata = build_step(case, device, generator)
    scale = case.head_dim**-0.5

    expected_cache = kv_cache.clone()
    write_kv_cache(key, value, expected_cache, metadata.slot_mapping)
    config = LaunchConfig(
        num_splits=case.num_splits, block_n=case.block_n, block_rows=case.block_rows
    )
    backend = TritonAttentionBackend(config)
    backend_output = backend.forward(query, key, value, kv_cache, metadata, scale)
    # Block 0 is the null block: padding tokens all write there, in no defined order.
    assert torch.equal(kv_cache[:, 1:], expected_cache[:, 1:]), "cache write differs"

    reference = paged_attention_reference(query.float(), kv_cache.float(), metadata, scale)
    num_tokens = metadata.query_start_loc_host[-1]
    reference = reference[:num_tokens]
    tolerance = TOLERANCE[case.dtype]
    check_close(backend_output[:num_tokens], reference, tolerance, f"backend, {case}")

    # One launch, and decodes at the front launched apart; poisoned output: any row the kernel
    # forgets stays NaN and fails.
    starts = metadata.query_start_loc_host
    num_leading_decodes = 0
    while num_leading_decodes < len(case.lengths) and case.lengths[num_leading_decodes][0] <= 1:
        num_leading_decodes += 1
    for leading in sorted({0, num_leading_decodes}):
        output = torch.full_like(query, float("nan"))
        paged_attention(
            query,
            kv_cache,
            metadata.block_tables,
            metadata.query_start_loc,
            metadata.seq_lens,
            max_query_len=metadata.max_query_len,
            scale=scale,
            num_leading_decodes=leading,
            output=output,
            config=config,
        )
        check_close(output[:num_tokens], reference, tolerance, f"{leading} leading, {case}")
    assert starts[-1] == num_tokens


def check_close(output: torch.Tensor, reference: torch.Tensor, tolerance: float, what: str) -> None:
    output = output.float()
    assert torch.isfinite(output).all(), f"unwritten or non-finite output rows: {what}"
    error = ((output - reference).norm() / reference.norm()).item()
    assert error < tolerance, f"relative error {error:.2e}: {what}"


# query_len, seq_len pairs: 1, 7, block size, block size + 1, long; with and without a prefix.
SINGLE_LENGTHS = [(1, 1), (1, 37), (7, 7), (7, 50), (16, 16), (17, 17), (17, 100), (300, 300)]
MIXED = [(1, 1), (1, 500), (7, 7), (0, 20), (17, 50), (300, 333), (16, 1000), (1, 33), (2, 2)]
DECODES_FIRST = [(1, 300)] * 5 + [(0, 4), (1, 17), (40, 40), (1, 9), (17, 100), (300, 310)]
DECODES = [(1, seq_len) for seq_len in (1, 15, 16, 17, 64, 65, 300, 1500, 4097, 9)]


@needs_cuda
@pytest.mark.parametrize("lengths", SINGLE_LENGTHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_single_request(lengths, dtype):
    check_case(Case([lengths], dtype=dtype, num_heads=8, num_kv_heads=2), "cuda")


@needs_cuda
@pytest.mark.parametrize("heads", [(2, 2), (8, 2), (16, 2), (16, 8), (6, 2), (32, 1)])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_mixed_batch_gqa(heads, head_dim):
    num_heads, num_kv_heads = heads
    check_case(
        Case(MIXED, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim), "cuda"
    )


@needs_cuda
@pytest.mark.parametrize("heads", [(16, 8), (32, 4)])
def test_decodes_first_launched_apart(heads):
    num_heads, num_kv_heads = heads
    case = Case(DECODES_FIRST, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=128)
    check_case(case, "cuda")


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("block_size", [8, 16, 32, 128])
def test_dtypes_and_block_sizes(dtype, block_size):
    case = Case(MIXED, dtype=dtype, block_size=block_size, num_padding_tokens=3)
    check_case(case, "cuda", seed=block_size)


@needs_cuda
@pytest.mark.parametrize("num_splits", [None, 1, 3, 16])
@pytest.mark.parametrize("heads", [(16, 8), (8, 1)])
def test_decode_batch_split_kv(num_splits, heads):
    num_heads, num_kv_heads = heads
    lengths = DECODES + [(0, 5)]  # a padding request with no query
    case = Case(lengths, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=128)
    case.num_splits = num_splits
    check_case(case, "cuda", seed=num_splits or 0)



# Verify steps: k + 1 query tokens a request over a cached context, beside a decode and a short
# chunk; few tiles, so the launch splits the context (default: chosen from the tile count).
VERIFY = [(5, 700), (5, 64), (3, 1500), (1, 40), (17, 300)]


@needs_cuda
@pytest.mark.parametrize("num_splits", [None, 1, 5])
@pytest.mark.parametrize("heads", [(16, 8), (32, 8)])
def test_verify_step_split_kv(num_splits, heads):
    num_heads, num_kv_heads = heads
    case = Case(VERIFY, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=128)
    case.num_splits = num_splits
    check_case(case, "cuda", seed=num_splits or 0)

# One long fresh prompt (no cached context, >= 512 tokens) takes SDPA
# (attention/fresh_prefill.py), decodes in front of it the paged decode launch; a cached prefix,
# a short prompt, or several prompts keep the paged launch.
FRESH = [[(1, 300), (1, 40), (700, 700)], [(512, 512)], [(2000, 2000)]]
NOT_FRESH = [[(600, 616)], [(600, 600), (300, 300)], [(700, 700), (1, 30)], [(600, 600)] * 2]


@needs_cuda
@pytest.mark.parametrize("lengths", FRESH + NOT_FRESH)
@pytest.mark.parametrize("heads", [(16, 8), (32, 8), (8, 8)])
def test_long_fresh_prompt_through_sdpa(lengths, heads, monkeypatch):
    from ladle.attention import triton_backend

    spans_seen = []
    original = triton_backend.attend_fresh_prompt

    def spy(query, key, value, output, span, scale):
        spans_seen.append(span)
        return original(query, key, value, output, span, scale)

    monkeypatch.setattr(triton_backend, "attend_fresh_prompt", spy)
    num_heads, num_kv_heads = heads
    check_case(Case(lengths, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=128), "cuda")
    assert bool(spans_seen) == (lengths in FRESH)


@needs_cuda
def test_repeat_is_stable():
    """The same inputs twice give bit-identical outputs (a race would make them move)."""
    for seed in range(3):
        check_case(Case(MIXED, num_heads=16, num_kv_heads=8, head_dim=128), "cuda", seed=seed)


@needs_cuda
def test_decode_cuda_graph_replay():
    """Capture one decode step, then replay it on new lengths, block tables and queries."""
    from ladle.attention.torch_backend import paged_attention_reference
    from ladle.attention.triton_backend import TritonAttentionBackend

    generator = torch.Generator().manual_seed(7)
    captured = Case([(1, 700)] * 12, num_heads=16, num_kv_heads=8, head_dim=128)
    query, key, value, kv_cache, metadata = build_step(captured, "cuda", generator)
    backend = TritonAttentionBackend()
    scale = 128**-0.5
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        backend.forward(query, key, value, kv_cache, metadata, scale)  # compile outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = backend.forward(query, key, value, kv_cache, metadata, scale)

    for seed in range(3):
        seq_lens = torch.randint(1, 701, (12,), generator=generator).tolist()
        fresh = Case(
            [(1, seq_len) for seq_len in seq_lens], num_heads=16, num_kv_heads=8, head_dim=128
        )
        new_query, new_key, new_value, new_cache, new_metadata = build_step(
            fresh, "cuda", generator
        )
        query.copy_(new_query)
        key.copy_(new_key)
        value.copy_(new_value)
        kv_cache.normal_()
        kv_cache[:, : new_cache.shape[1]].copy_(new_cache)
        metadata.block_tables.zero_()
        metadata.block_tables[:, : new_metadata.block_tables.shape[1]].copy_(
            new_metadata.block_tables
        )
        metadata.slot_mapping.copy_(new_metadata.slot_mapping)
        metadata.seq_lens.copy_(new_metadata.seq_lens)
        output.fill_(float("nan"))
        graph.replay()
        new_metadata.block_tables = metadata.block_tables
        reference = paged_attention_reference(query.float(), kv_cache.float(), new_metadata, scale)
        error = ((output.float() - reference).norm() / reference.norm()).item()
        assert error < TOLERANCE[torch.bfloat16], f"replay {seed}: relative error {error:.2e}"


INTERPRETED_CASES = [
    Case(
        [(1, 1), (7, 7), (8, 8), (9, 20), (30, 30)],
        num_heads=2,
        num_kv_heads=2,
        head_dim=16,
        block_size=8,
        dtype=torch.float32,
    ),
    # fp16, not bf16: the Triton 3.9 interpreter's tl.dot gives garbage on bf16 operands.
    Case(
        [(1, 40), (0, 3), (9, 9), (1, 1), (5, 21)],
        num_heads=8,
        num_kv_heads=2,
        head_dim=32,
        block_size=8,
        dtype=torch.float16,
        num_padding_tokens=2,
    ),
    Case(
        [(1, 40), (1, 9), (1, 17)],
        num_heads=6,
        num_kv_heads=2,
        head_dim=16,
        block_size=16,
        dtype=torch.float16,
        num_splits=3,
    ),
    Case(
        [(17, 17), (1, 50)],
        num_heads=8,
        num_kv_heads=1,
        head_dim=16,
        block_size=16,
        dtype=torch.float32,
    ),
    # Several query tiles per request (64 tokens x group 2 per tile) and a long cached prefix.
    Case(
        [(70, 90), (1, 5), (130, 130), (3, 3), (64, 200)],
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        block_size=32,
        dtype=torch.float32,
    ),
    # Small context tiles: many unmasked tiles before the diagonal, pages split across tiles.
    Case(
        [(20, 90), (1, 77), (33, 33)],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=8,
        dtype=torch.float32,
        block_n=16,
    ),
    Case(
        [(1, 90), (1, 77), (1, 16)],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=32,
        dtype=torch.float32,
        block_n=16,
        num_splits=3,
    ),
    # Decodes first, then prefill chunks: launched apart by the backend.
    Case(
        [(1, 20), (0, 3), (1, 9), (12, 12), (1, 5), (40, 47)],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=8,
        dtype=torch.float32,
    ),
    # 20 decodes first, 8-token tiles: the prefill launch starts past tile 0 (spare tiles exit).
    Case(
        [(1, 5)] * 20 + [(12, 12), (1, 3), (30, 40)],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=8,
        dtype=torch.float32,
        block_rows=16,
    ),
    # Verify steps (a few query tokens a request over a cached context), split: each split
    # writes a partial per query row and the last to arrive merges every token of its tile.
    Case(
        [(5, 40), (5, 70), (3, 21), (1, 9)],
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        block_size=8,
        dtype=torch.float32,
        block_n=16,
        num_splits=3,
    ),
    # A split launch with several tiles a request (8-token tiles) and a padding token.
    Case(
        [(20, 60), (1, 30), (9, 9)],
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        block_size=8,
        dtype=torch.float32,
        block_rows=16,
        num_splits=4,
        num_padding_tokens=1,
    ),
    # More splits than context tiles: empty splits must merge to nothing.
    Case(
        [(1, 3), (1, 70), (1, 129)],
        num_heads=4,
        num_kv_heads=1,
        head_dim=16,
        block_size=8,
        dtype=torch.float32,
        num_splits=16,
    ),
]


@pytest.mark.skipif(not INTERPRET, reason="runs in the TRITON_INTERPRET=1 child process")
@pytest.mark.parametrize("index", range(len(INTERPRETED_CASES)))
def test_interpreted(index):
    check_case(INTERPRETED_CASES[index], "cpu", seed=index)


@pytest.mark.skipif(INTERPRET or not HAS_TRITON, reason="needs triton; is the parent process")
@pytest.mark.skipif(HAS_CUDA, reason="the GPU tests cover it; for machines without CUDA")
def test_on_cpu_interpreter():
    """Run test_interpreted in a child with TRITON_INTERPRET=1, on the CPU.

    Needs Triton >= 3.9's interpreter with numpy 2: 3.6's turns a loaded scalar into a 1-element
    array, which range() (the context loop) refuses.
    """
    environment = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            f"{Path(__file__)}::test_interpreted",
        ],
        env=environment,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
