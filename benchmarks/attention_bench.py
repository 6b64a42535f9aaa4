"""Paged attention on the GPU: achieved bandwidth (decode) and TFLOP/s (prefill), against torch's
SDPA on the same data laid out contiguously, plus a sweep of launch configs.

    PYTHONPATH=src python benchmarks/attention_bench.py [--out DIR] [--no-sweep]

Decode reads every cached K and V once: bytes = 2 * num_reqs * seq_len * num_kv_heads * head_dim *
itemsize (+ q and out, negligible); the floor is bytes / measured copy bandwidth. Prefill counts
4 * num_heads * head_dim FLOPs per visible (query, key) pair.
"""

from __future__ import annotations

import argparse
import json
import os
import warnings
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from ladle.bench.gpu_timing import capture_graph
from ladle.kernels.paged_attention import LaunchConfig, paged_attention


@dataclass
class Shape:
    name: str
    num_reqs: int
    query_len: int
    seq_len: int
    num_heads: int = 16  # Qwen3-0.6B
    num_kv_heads: int = 8
    head_dim: int = 128
    block_size: int = 16
    dtype: torch.dtype = torch.bfloat16


def build(shape: Shape, device: str = "cuda"):
    """Random paged cache over shuffled blocks, and the matching contiguous K/V for the peer."""
    blocks_per_req = triton.cdiv(shape.seq_len, shape.block_size)
    num_blocks = shape.num_reqs * blocks_per_req + 1
    kv_cache = torch.randn(
        2,
        num_blocks,
        shape.block_size,
        shape.num_kv_heads,
        shape.head_dim,
        dtype=shape.dtype,
        device=device,
    )
    block_tables = (torch.randperm(num_blocks - 1, device=device) + 1).to(torch.int32)
    block_tables = block_tables.view(shape.num_reqs, blocks_per_req)
    num_tokens = shape.num_reqs * shape.query_len
    query = torch.randn(
        num_tokens, shape.num_heads, shape.head_dim, dtype=shape.dtype, device=device
    )
    query_start_loc = torch.arange(
        0, num_tokens + 1, shape.query_len, dtype=torch.int32, device=device
    )
    seq_lens = torch.full((shape.num_reqs,), shape.seq_len, dtype=torch.int32, device=device)
    return query, kv_cache, block_tables, query_start_loc, seq_lens


def contiguous_kv(kv_cache, block_tables, shape: Shape):
    """[2, num_reqs, num_kv_heads, seq_len, head_dim]: what SDPA wants."""
    gathered = kv_cache[:, block_tables.long()]  # [2, reqs, blocks, block_size, kv_heads, dim]
    gathered = gathered.flatten(2, 3)[:, :, : shape.seq_len]
    return gathered.transpose(2, 3).contiguous()


def time_in_graph(fn, warmup_ms: int = 25, repeat_ms: int = 200) -> float:
    """Median milliseconds of one replay of a CUDA graph holding fn (no launch gaps)."""
    fn()
    graph, _ = capture_graph(fn)
    return do_bench(graph.replay, warmup=warmup_ms, rep=repeat_ms, return_mode="median")


def bytes_moved(shape: Shape) -> int:
    itemsize = torch.empty((), dtype=shape.dtype).element_size()
    kv = 2 * shape.num_reqs * shape.seq_len * shape.num_kv_heads * shape.head_dim * itemsize
    query_and_output = 2 * shape.num_reqs * shape.query_len * shape.num_heads * shape.head_dim
    return kv + query_and_output * itemsize


def flops(shape: Shape) -> int:
    prefix = shape.seq_len - shape.query_len
    pairs = shape.query_len * prefix + shape.query_len * (shape.query_len + 1) // 2
    return 4 * shape.num_reqs * pairs * shape.num_heads * shape.head_dim


def sdpa_peers(query, kv_cache, block_tables, shape: Shape) -> dict[str, float]:
    """SDPA on contiguous tensors, per backend that accepts the inputs: name -> ms."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    keys, values = contiguous_kv(kv_cache, block_tables, shape)
    q = query.view(shape.num_reqs, shape.query_len, shape.num_heads, shape.head_dim)
    q = q.transpose(1, 2).contiguous()
    is_causal = shape.query_len > 1 and shape.query_len == shape.seq_len
    if shape.query_len > 1 and not is_causal:
        return {}
    results = {}
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
    ):

        def run(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(
                    q, keys, values, is_causal=is_causal, enable_gqa=True
                )

        try:
            run()
            torch.cuda.synchronize()
            results[backend.name.lower()] = do_bench(run, warmup=25, rep=200, return_mode="median")
        except Exception as error:  # noqa: BLE001 (a backend refusing these shapes is no peer)
            results[backend.name.lower()] = f"refused: {str(error).splitlines()[0][:80]}"
    return results


def time_paged(query, kv_cache, block_tables, query_start_loc, seq_lens, shape, config):
    scale = shape.head_dim**-0.5
    output = torch.empty_like(query)

    def run():
        paged_attention(
            query,
            kv_cache,
            block_tables,
            query_start_loc,
            seq_lens,
            max_query_len=shape.query_len,
            scale=scale,
            output=output,
            config=config,
        )

    if shape.query_len == 1:
        return time_in_graph(run)
    run()
    return do_bench(run, warmup=25, rep=200, return_mode="median")


def check_against_peer(query, kv_cache, block_tables, query_start_loc, seq_lens, shape) -> float:
    """Relative error of the paged kernel against fp32 math SDPA on contiguous tensors."""
    keys, values = contiguous_kv(kv_cache, block_tables, shape)
    q = query.view(shape.num_reqs, shape.query_len, shape.num_heads, shape.head_dim)
    mask = None
    if shape.query_len > 1:
        query_positions = torch.arange(
            shape.seq_len - shape.query_len, shape.seq_len, device=query.device
        )
        mask = torch.arange(shape.seq_len, device=query.device)[None, :] <= query_positions[:, None]
    expected = F.scaled_dot_product_attention(
        q.transpose(1, 2).float(), keys.float(), values.float(), attn_mask=mask, enable_gqa=True
    ).transpose(1, 2)
    output = paged_attention(
        query,
        kv_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        max_query_len=shape.query_len,
        scale=shape.head_dim**-0.5,
    ).view_as(expected)
    return ((output.float() - expected).norm() / expected.norm()).item()


def mixed_step(
    num_decodes: int, decode_context: int, num_prefills: int, prefill_len: int, device: str = "cuda"
):
    """Decodes first, then fresh prefill chunks: (kv bytes, flops, one-launch ms, apart ms, err)."""
    from ladle.attention.metadata import AttentionMetadata
    from ladle.attention.torch_backend import paged_attention_reference

    decode = Shape("d", num_decodes, 1, decode_context)
    prefill = Shape("p", num_prefills, prefill_len, prefill_len)
    query_d, cache_d, tables_d, _, _ = build(decode, device)
    query_p, cache_p, tables_p, _, _ = build(prefill, device)
    # One cache: the prefill blocks after the decode blocks (block 0 stays the null block).
    kv_cache = torch.cat([cache_d, cache_p[:, 1:]], dim=1)
    width = max(tables_d.shape[1], tables_p.shape[1])
    block_tables = torch.zeros(num_decodes + num_prefills, width, dtype=torch.int32, device=device)
    block_tables[:num_decodes, : tables_d.shape[1]] = tables_d
    block_tables[num_decodes:, : tables_p.shape[1]] = tables_p + cache_d.shape[1] - 1
    query = torch.cat([query_d, query_p])
    query_lens = [1] * num_decodes + [prefill_len] * num_prefills
    seq_lens_host = [decode_context] * num_decodes + [prefill_len] * num_prefills
    starts = [0]
    for query_len in query_lens:
        starts.append(starts[-1] + query_len)
    metadata = AttentionMetadata(
        slot_mapping=torch.zeros(len(query), dtype=torch.int64, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens_host, dtype=torch.int32, device=device),
        block_tables=block_tables,
        max_query_len=prefill_len,
        max_seq_len=max(seq_lens_host),
        block_size=16,
        query_start_loc_host=starts,
        seq_lens_host=seq_lens_host,
    )
    scale = decode.head_dim**-0.5
    reference = paged_attention_reference(query.float(), kv_cache.float(), metadata, scale)
    times, errors = [], []
    for leading in (0, num_decodes):
        output = torch.empty_like(query)

        def run(leading=leading, output=output):
            paged_attention(
                query,
                kv_cache,
                block_tables,
                metadata.query_start_loc,
                metadata.seq_lens,
                max_query_len=prefill_len,
                scale=scale,
                num_leading_decodes=leading,
                output=output,
            )

        run()
        errors.append(((output.float() - reference).norm() / reference.norm()).item())
        times.append(do_bench(run, warmup=25, rep=200, return_mode="median"))
    kv_bytes = bytes_moved(decode) + bytes_moved(prefill)
    return kv_bytes, flops(decode) + flops(prefill), times[0], times[1], max(errors)


def cache_write_times(num_tokens: int = 256) -> tuple[float, float]:
    """ms of the fused Triton cache write and of write_kv_cache (index_copy_), in CUDA graphs."""
    from ladle.attention.base import write_kv_cache
    from ladle.kernels.reshape_and_cache import reshape_and_cache

    shape = Shape("write", num_tokens, 1, 1024)
    _, kv_cache, _, _, _ = build(shape)
    qkv = torch.randn(num_tokens, 32, 128, dtype=shape.dtype, device="cuda")
    key, value = qkv[:, 16:24], qkv[:, 24:]  # strided views, as a fused qkv projection gives
    slots = torch.randperm(kv_cache.shape[1] * 16 - 16, device="cuda")[:num_tokens] + 16
    fused = time_in_graph(lambda: reshape_and_cache(key, value, kv_cache, slots))
    expected = kv_cache.clone()
    write_kv_cache(key, value, expected, slots)
    assert torch.equal(expected, kv_cache), "fused cache write differs from write_kv_cache"
    reference = time_in_graph(lambda: write_kv_cache(key, value, kv_cache, slots))
    return fused, reference


def copy_bandwidth() -> float:
    """GB/s of a 2 GiB device-to-device copy, counting bytes read plus written."""
    source = torch.randn(2**29, device="cuda")
    target = torch.empty_like(source)
    milliseconds = do_bench(lambda: target.copy_(source), warmup=25, rep=200, return_mode="median")
    return 2 * source.numel() * 4 / milliseconds / 1e6


DECODE_SHAPES = [
    Shape("decode 256x1024", 256, 1, 1024),
    Shape("decode 64x4096", 64, 1, 4096),
    Shape("decode 16x8192", 16, 1, 8192),
    Shape("decode 4x32768", 4, 1, 32768),
    Shape("decode 256x1024 g4", 256, 1, 1024, num_heads=32, num_kv_heads=8),
    Shape("decode 256x1024 d64", 256, 1, 1024, num_heads=16, num_kv_heads=8, head_dim=64),
]
PREFILL_SHAPES = [
    Shape("prefill 4x2048", 4, 2048, 2048),
    Shape("prefill 1x8192", 1, 8192, 8192),
    Shape("chunk 8x512/4096", 8, 512, 4096),
]
DECODE_SWEEP = [
    LaunchConfig(block_n=block_n, num_warps=warps, num_stages=stages)
    for block_n in (64, 128)
    for warps in (4, 8)
    for stages in (2, 3)
]
HEAD_DIM_64_SWEEP = [
    LaunchConfig(block_n=block_n, num_warps=warps, num_stages=stages)
    for block_n in (64, 128, 256)
    for warps in (2, 4, 8)
    for stages in (2, 3)
]
SPLIT_SWEEP = [LaunchConfig(num_splits=splits) for splits in (1, 2, 4, 8, 16)]
PREFILL_SWEEP = [
    LaunchConfig(block_rows=rows, block_n=block_n, num_warps=warps, num_stages=stages)
    for rows in (64, 128)
    for block_n in (32, 64)
    for warps in (4, 8)
    for stages in (2, 3)
]


SPLIT_SWEEPS = {"decode 64x4096": SPLIT_SWEEP, "decode 16x8192": SPLIT_SWEEP}
FULL_SWEEPS = {
    "decode 256x1024": DECODE_SWEEP,
    "decode 256x1024 d64": HEAD_DIM_64_SWEEP,
    "prefill 4x2048": PREFILL_SWEEP,
    **SPLIT_SWEEPS,
}


def run_sweep(shape: Shape, configs: list[LaunchConfig], inputs) -> list[dict]:
    rows = []
    for config in configs:
        try:
            milliseconds = time_paged(*inputs, shape, config)
        except Exception as error:  # noqa: BLE001 (out of shared memory: skip the config)
            rows.append({"config": asdict(config), "error": str(error).splitlines()[0][:100]})
            continue
        rows.append({"config": asdict(config), "ms": milliseconds})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--no-sweep", action="store_true", help="defaults only")
    parser.add_argument(
        "--full-sweep", action="store_true", help="tile shapes too, not only splits"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)  # SDPA explaining refusals
    torch.manual_seed(0)
    results: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cases": [],
        "sweeps": {},
    }
    bandwidth = copy_bandwidth()
    results["copy_gbps"] = bandwidth
    table = []
    for shape in DECODE_SHAPES + PREFILL_SHAPES:
        inputs = build(shape)
        error = check_against_peer(*inputs, shape)
        milliseconds = time_paged(*inputs, shape, None)
        peers = sdpa_peers(inputs[0], inputs[1], inputs[2], shape)
        case = {
            "shape": shape.name,
            "ms": milliseconds,
            "rel_error": error,
            "peers": peers,
            "gbps": bytes_moved(shape) / milliseconds / 1e6,
            "tflops": flops(shape) / milliseconds / 1e9,
            "floor_ms": bytes_moved(shape) / bandwidth / 1e6,
        }
        results["cases"].append(case)
        table.append(case)
        print(json.dumps(case, default=str), flush=True)
        sweeps = FULL_SWEEPS if args.full_sweep else SPLIT_SWEEPS
        if not args.no_sweep and shape.name in sweeps:
            results["sweeps"][shape.name] = run_sweep(shape, sweeps[shape.name], inputs)
        del inputs
        torch.cuda.empty_cache()
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "attention_bench.json"), "w") as file:
            json.dump(results, file, indent=1, default=str)  # after each case: a timeout keeps it

    try:
        fused_write, index_copy_write = cache_write_times()
        writes = {"triton": fused_write, "index_copy": index_copy_write}
    except Exception as error:  # noqa: BLE001 (report it; the attention table still prints)
        writes = {"error": str(error)[:200]}
    results["cache_write_256_tokens_ms"] = writes
    kv_bytes, mixed_flops, one_launch, apart, mixed_error = mixed_step(128, 2048, 4, 512)
    results["mixed"] = {
        "case": "128 decodes x 2048 + 4 prefills x 512",
        "one_launch_ms": one_launch,
        "decodes_apart_ms": apart,
        "rel_error": mixed_error,
        "floor_ms": kv_bytes / bandwidth / 1e6,
        "flops": mixed_flops,
    }
    with open(os.path.join(args.out, "attention_bench.json"), "w") as file:
        json.dump(results, file, indent=1, default=str)

    print(json.dumps(results["cache_write_256_tokens_ms"]))
    for name, sweep in results["sweeps"].items():
        timed = sorted((row for row in sweep if "ms" in row), key=lambda row: row["ms"])
        print(f"\nsweep {name}: best 5 of {len(sweep)}")
        for row in timed[:5]:
            print(f"  {row['ms'] * 1e3:8.1f} us  {row['config']}")
    print(f"\n{results['device']}  torch {results['torch']}  triton {results['triton']}")
    print(f"copy bandwidth {bandwidth:.0f} GB/s")
    print(f"{'case':24} {'us':>9} {'GB/s':>7} {'%copy':>6} {'TFLOP/s':>8} {'err':>8}  peers (us)")
    for case in table:
        peers = "  ".join(
            f"{name}={value * 1e3:.1f}" if isinstance(value, float) else f"{name}:refused"
            for name, value in case["peers"].items()
        )
        print(
            f"{case['shape']:24} {case['ms'] * 1e3:9.1f} {case['gbps']:7.0f} "
            f"{100 * case['gbps'] / bandwidth:5.0f}% {case['tflops']:8.1f} "
            f"{case['rel_error']:8.1e}  {peers}"
        )
    mixed = results["mixed"]
    print(
        f"{mixed['case']}: one launch {mixed['one_launch_ms'] * 1e3:.1f} us, decodes apart "
        f"{mixed['decodes_apart_ms'] * 1e3:.1f} us (kv floor {mixed['floor_ms'] * 1e3:.1f} us), "
        f"err {mixed['rel_error']:.1e}"
    )


if __name__ == "__main__":
    main()
