"""One-row matmuls (batch-1 decode): cuBLAS against the Triton GEMV's tiles, in TB/s, at the
shapes one rank of a tensor-parallel group reads (column-parallel qkv / gate_up / LM head keep
K and split N; row-parallel o / down split K).

    python scripts/gemv_bench.py [--model llama-3.1-8b|llama-3.1-70b|qwen3-0.6b|qwen3-30b-a3b]
        [--tp 1 2 4] [--json out.json]

Each case runs 24 calls back to back inside one CUDA graph (as a decode graph runs them), each
on its own weight (a ring larger than the 50 MB L2, so every call reads HBM), random bf16
values. Reports us per call and the weight bytes read per second, medians of 5 replays, and
the Triton result's largest error against cuBLAS's.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import triton

from ladle.bench.gpu_timing import calls_in_graph_us
from ladle.kernels.gemv import _gemv_kernel

MODELS = {  # name: (N, K) of each weight at one GPU
    "llama-3.1-8b": {
        "qkv": (6144, 4096),
        "o": (4096, 4096),
        "gate_up": (28672, 4096),
        "down": (4096, 14336),
        "lm_head": (128256, 4096),
    },
    # Small shapes, where a decode step is many short GEMVs (issues 35, 38): the 0.6B's N = 1024
    # projections give the default tile few programs.
    "qwen3-0.6b": {
        "qkv": (4096, 1024),
        "o": (1024, 2048),
        "gate_up": (6144, 1024),
        "down": (1024, 3072),
        "lm_head": (151936, 1024),
    },
    "qwen3-30b-a3b": {  # the attention projections and the router; the experts: moe_tile_sweep.py
        "qkv": (5120, 2048),
        "o": (2048, 4096),
        "router": (128, 2048),
        "lm_head": (151936, 2048),
    },
    "llama-3.1-70b": {
        "qkv": (10240, 8192),
        "o": (8192, 8192),
        "gate_up": (57344, 8192),
        "down": (8192, 28672),
        "lm_head": (128256, 8192),
    },
}
ROW_PARALLEL = ("o", "down")  # split along K; the others along N
REPLICATED = ("router",)  # every rank holds it whole


def rank_shapes(model: str, tp: int) -> dict[str, tuple[int, int]]:
    """Each weight's (N, K) on one rank of a TP group of size tp."""
    shapes = {}
    for name, (n, k) in MODELS[model].items():
        if name in REPLICATED:
            shapes[name] = (n, k)
        else:
            shapes[name] = (n, k // tp) if name in ROW_PARALLEL else (n // tp, k)
    return shapes


def triton_gemv(x, w, out, block_n, block_k, warps, stages):
    n, k = w.shape
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x,
        w,
        w,
        out,
        n,
        k,
        x,  # no norm prologue: its operands unused
        x,
        x,
        0.0,
        HAS_BIAS=False,
        BLOCK_N=block_n,
        BLOCK_K=min(block_k, k),
        NORM=False,
        HAS_RESIDUAL=False,
        num_warps=warps,
        num_stages=stages,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-8b", choices=sorted(MODELS))
    parser.add_argument("--tp", type=int, nargs="+", default=[1])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    configs = [
        (block_n, block_k, warps, stages)
        for block_n in (1, 2, 4, 8)
        for block_k in (512, 1024, 2048)
        for warps, stages in ((4, 3), (4, 4), (8, 3), (8, 4))
    ]
    cases = [
        (tp, name, n, k) for tp in args.tp for name, (n, k) in rank_shapes(args.model, tp).items()
    ]
    rows = []
    for tp, name, n, k in cases:
        ring = max(2, -(-120_000_000 // (n * k * 2)))
        calls_per_graph = 24 if n * k < 100_000_000 else 8
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 64 for _ in range(ring)]
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        outs = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in range(ring)]
        reference = torch.nn.functional.linear(x, weights[0])
        cublas_us = calls_in_graph_us(
            [
                functools.partial(torch.mm, x, weights[i % ring].t(), out=outs[i % ring])
                for i in range(calls_per_graph)
            ]
        )
        best = None
        results = []
        for config in configs:
            block_n, block_k, warps, stages = config
            if block_k > k:
                continue
            try:
                us = calls_in_graph_us(
                    [
                        functools.partial(
                            triton_gemv, x, weights[i % ring], outs[i % ring], *config
                        )
                        for i in range(calls_per_graph)
                    ]
                )
            except Exception as error:  # a config that does not compile or fit
                results.append(
                    {"config": [block_n, block_k, warps, stages], "error": str(error)[:80]}
                )
                continue
            triton_gemv(x, weights[0], outs[0], *config)
            error = (outs[0].float() - reference.float()).abs().max().item()
            results.append(
                {"config": [block_n, block_k, warps, stages], "us": round(us, 2), "err": error}
            )
            if best is None or us < best[0]:
                best = (us, [block_n, block_k, warps, stages], error)
        gb = n * k * 2 / 1e9
        row = {
            "model": args.model,
            "tp": tp,
            "shape": name,
            "N": n,
            "K": k,
            "cublas_us": round(cublas_us, 2),
            "cublas_tb_s": round(gb / cublas_us * 1e6 / 1000, 3),
            "triton_best_us": round(best[0], 2),
            "triton_best_tb_s": round(gb / best[0] * 1e6 / 1000, 3),
            "triton_best_config": best[1],
            "triton_best_max_err": best[2],
            "reference_max_abs": reference.abs().max().item(),
            "all": results,
        }
        rows.append(row)
        print(json.dumps({key: value for key, value in row.items() if key != "all"}), flush=True)
        del weights, outs
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
