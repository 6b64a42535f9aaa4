"""Why 64-row FP8 tiles failed tests/gpu/test_fp8_matmul.py: the error of the Triton kernel
against float32 over the same codes, and its speed, with and without a bound on the tensor
cores' reduced-precision accumulation (tl.dot's max_num_imprecise_acc; Hopper's wgmma, which
64-row tiles use, sums fp8 products at reduced precision by default).

    python scripts/fp8_tile_precision_probe.py

One JSON line per (shape, rows, tile): relative error norm against float32, the largest
elementwise difference from torch._scaled_mm relative to its largest value, us per call in a
CUDA graph over a weight ring larger than L2.
"""

from __future__ import annotations

import functools
import json

import torch

from ladle.bench.gpu_timing import PROJECTIONS_8B, calls_in_graph_us
from ladle.kernels.fp8_matmul import Fp8Tile, fp8_matmul

SHAPES = PROJECTIONS_8B


def fp8_operands(n: int, k: int, generator: torch.Generator):
    """(a ring of random e4m3 [n, k] weights larger than L2, their float32 scales [n], calls per
    graph, a maker of (codes, float32 scales [rows, 1]) for `rows` activation rows)."""
    ring = max(2, -(-120_000_000 // (n * k)))
    weights = [
        (torch.randn(n, k, device="cuda", generator=generator) * 64)
        .clamp(-448, 448)
        .to(torch.float8_e4m3fn)
        for _ in range(ring)
    ]
    w_scale = torch.rand(n, device="cuda", generator=generator) * 1e-3 + 1e-4

    def activations(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = (torch.randn(rows, k, device="cuda", generator=generator) * 64).clamp(-448, 448)
        x_scale = torch.rand(rows, 1, device="cuda", generator=generator) * 1e-2 + 1e-3
        return x.to(torch.float8_e4m3fn), x_scale

    return weights, w_scale, 24 if n * k < 100_000_000 else 8, activations


def main() -> None:
    for name, (n, k) in SHAPES.items():
        generator = torch.Generator(device="cuda").manual_seed(n + k)
        weights, w_scale, calls, activations = fp8_operands(n, k, generator)
        ring = len(weights)
        for tokens in (17, 32, 64, 128):
            x_codes, x_scale = activations(tokens)
            expected = (x_codes.float() * x_scale) @ (weights[0].float() * w_scale[:, None]).t()
            cublas = torch._scaled_mm(
                x_codes,
                weights[0].t(),
                scale_a=x_scale,
                scale_b=w_scale[None, :],
                out_dtype=torch.bfloat16,
            ).float()
            cublas_us = calls_in_graph_us(
                [
                    functools.partial(
                        torch._scaled_mm,
                        x_codes,
                        weights[i % ring].t(),
                        scale_a=x_scale,
                        scale_b=w_scale[None, :],
                        out_dtype=torch.bfloat16,
                    )
                    for i in range(calls)
                ],
                replays=3,
            )
            cublas_err = ((cublas - expected).norm() / expected.norm()).item()
            print(
                json.dumps(
                    {
                        "shape": name,
                        "tokens": tokens,
                        "tile": "scaled_mm",
                        "us": round(cublas_us, 2),
                        "rel_err": cublas_err,
                    }
                ),
                flush=True,
            )
            for block_m in (16, 32, 64):
                if block_m < 64 and tokens > 32:
                    continue
                for imprecise in (None, 32, 64, 128):
                    for block_k in (128, 256):
                        if imprecise is not None and imprecise > block_k:
                            continue
                        tile = Fp8Tile(
                            block_m,
                            64,
                            block_k,
                            num_warps=4,
                            num_stages=3 if n >= 16384 else 4,
                            max_imprecise_acc=imprecise,
                        )
                        try:
                            got = fp8_matmul(x_codes, weights[0], x_scale, w_scale, tile).float()
                            us = calls_in_graph_us(
                                [
                                    functools.partial(
                                        fp8_matmul,
                                        x_codes,
                                        weights[i % ring],
                                        x_scale,
                                        w_scale,
                                        tile,
                                    )
                                    for i in range(calls)
                                ],
                                replays=3,
                            )
                        except Exception as failure:  # noqa: BLE001
                            print(
                                json.dumps(
                                    {
                                        "shape": name,
                                        "tokens": tokens,
                                        "tile": str(tile),
                                        "error": str(failure)[:160],
                                    }
                                ),
                                flush=True,
                            )
                            continue
                        error = ((got - expected).norm() / expected.norm()).item()
                        vs_cublas = ((got - cublas).abs().max() / cublas.abs().max()).item()
                        close = torch.allclose(got, cublas, rtol=2e-2, atol=1e-2)
                        print(
                            json.dumps(
                                {
                                    "shape": name,
                                    "tokens": tokens,
                                    "tile": str(tile),
                                    "us": round(us, 2),
                                    "rel_err": error,
                                    "max_vs_cublas": vs_cublas,
                                    "allclose_cublas": close,
                                }
                            ),
                            flush=True,
                        )
        del weights
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
