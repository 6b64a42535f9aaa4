"""FP8 W8A8 projections of the 8B shape at decode sizes: torch._scaled_mm (cuBLASLt, row-wise
scales) against ladle's Triton kernel (kernels/fp8_matmul.py) over a sweep of tiles.

    python scripts/fp8_gemm_bench.py [--json out.json] [--tokens 128 256] [--shapes o down]
        [--wide-tiles]

--wide-tiles: above 64 rows, the set of 64- and 128-row tiles of the session-8 sweep (fast
accumulation, as both kernels run by default) instead of the original grid.

Each case: 8-24 calls back to back in one CUDA graph, each on its own weight (a ring larger
than L2), random codes; us per call (median of 5 replays) and the fp8 weight's TB/s; the
Triton result's largest relative difference from _scaled_mm's.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch

from ladle.bench.gpu_timing import PROJECTIONS_8B, calls_in_graph_us
from ladle.kernels.fp8_matmul import FAST_ACCUMULATION, Fp8Tile, fp8_matmul

SHAPES = PROJECTIONS_8B
TOKENS = (1, 16, 64, 256)


# Above 64 rows: 64- and 128-row tiles (wgmma), 4 or 8 warps (session 8's sweep).
WIDE_TILES = [
    Fp8Tile(64, 64, 256, num_warps=4, num_stages=4),
    Fp8Tile(64, 64, 128, num_warps=4, num_stages=4),
    Fp8Tile(64, 128, 128, num_warps=4, num_stages=4),
    Fp8Tile(64, 128, 256, num_warps=4, num_stages=3),
    Fp8Tile(64, 128, 128, num_warps=8, num_stages=4),
    Fp8Tile(128, 64, 128, num_warps=8, num_stages=4),
    Fp8Tile(128, 128, 128, num_warps=8, num_stages=3),
    Fp8Tile(128, 128, 128, num_warps=8, num_stages=4),
]


def tiles_for(tokens: int) -> list[Fp8Tile]:
    block_ms = (16,) if tokens <= 16 else (64,) if tokens <= 64 else (64, 128)
    return [
        Fp8Tile(block_m, block_n, block_k, num_warps=8 if block_m == 128 else 4, num_stages=stages)
        for block_m in block_ms
        for block_n in (32, 64, 128)
        for block_k in (128, 256)
        for stages in (3, 4)
    ]


def scaled_mm(x_codes, weight, x_scale, w_scale_row):
    return torch._scaled_mm(
        x_codes,
        weight.t(),
        scale_a=x_scale,
        scale_b=w_scale_row,
        out_dtype=torch.bfloat16,
        use_fast_accum=FAST_ACCUMULATION,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--wide-tiles", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for name in args.shapes:
        n, k = SHAPES[name]
        ring = max(2, -(-120_000_000 // (n * k)))
        calls = 24 if n * k < 100_000_000 else 8
        weights = [
            (torch.randn(n, k, device="cuda") * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
            for _ in range(ring)
        ]
        w_scale = torch.rand(n, device="cuda") * 1e-3 + 1e-4
        for tokens in args.tokens:
            x_codes = (
                (torch.randn(tokens, k, device="cuda") * 100)
                .clamp(-448, 448)
                .to(torch.float8_e4m3fn)
            )
            x_scale = torch.rand(tokens, 1, device="cuda") * 1e-2 + 1e-3
            reference = scaled_mm(x_codes, weights[0], x_scale, w_scale[None, :])
            cublas_us = calls_in_graph_us(
                [
                    functools.partial(
                        scaled_mm, x_codes, weights[i % ring], x_scale, w_scale[None, :]
                    )
                    for i in range(calls)
                ],
                replays=3,
            )
            best, results = None, []
            tiles = WIDE_TILES if args.wide_tiles and tokens > 64 else tiles_for(tokens)
            for tile in tiles:
                try:
                    us = calls_in_graph_us(
                        [
                            functools.partial(
                                fp8_matmul, x_codes, weights[i % ring], x_scale, w_scale, tile
                            )
                            for i in range(calls)
                        ],
                        replays=3,
                    )
                    got = fp8_matmul(x_codes, weights[0], x_scale, w_scale, tile)
                    error = (
                        (got.float() - reference.float()).abs().max()
                        / reference.float().abs().max()
                    ).item()
                except Exception as failure:  # a tile that does not build or fit
                    results.append({"tile": str(tile), "error": str(failure)[:100]})
                    continue
                results.append({"tile": str(tile), "us": round(us, 2), "rel_err": error})
                if best is None or us < best[0]:
                    best = (us, tile, error)
            gb = n * k / 1e9
            row = {
                "shape": name,
                "tokens": tokens,
                "scaled_mm_us": round(cublas_us, 2),
                "scaled_mm_tb_s": round(gb / cublas_us * 1e3, 3),
                "triton_best_us": round(best[0], 2) if best else None,
                "triton_best_tb_s": round(gb / best[0] * 1e3, 3) if best else None,
                "triton_best_tile": str(best[1]) if best else None,
                "triton_best_rel_err": best[2] if best else None,
                "all": results,
            }
            rows.append(row)
            print(
                json.dumps({key: value for key, value in row.items() if key != "all"}), flush=True
            )
        del weights
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
