"""FP8 W8A8 projections of the 8B shape at decode sizes: torch._scaled_mm (cuBLASLt, row-wise
scales) against ladle's Triton kernel (kernels/fp8_matmul.py) over a sweep of tiles.

    python scripts/fp8_gemm_bench.py [--json out.json] [--tokens 128 256] [--shapes o down]
        [--wide-tiles]
    python scripts/fp8_gemm_bench.py --one-row [--scale-group 0|128] [--json out.json]

--wide-tiles: above 64 rows, the set of 64- and 128-row tiles of the session-8 sweep (fast
accumulation, as both kernels run by default) instead of the original grid.

Each case: 8-24 calls back to back in one CUDA graph, each on its own weight (a ring larger
than L2), random codes; us per call (median of 5 replays) and the fp8 weight's TB/s; the
Triton result's largest relative difference from _scaled_mm's.

--one-row: batch-1 decode's projections each as the step runs them, us per call and TB/s of the
weight: the fp8 GEMV (kernels/fp8_gemv.py) at every tile of its CANDIDATE_TILES against the
W8A8 path it replaces (the per-token quantization launch where the producer does not quantize,
then the Triton kernel; SiLU-and-mul after gate_up) and the bf16 GEMV (kernels/gemv.py, bf16
weights). qkv and gate_up read a QuantizedActivation (their RMSNorm quantizes it), o and down
the bf16 row; gate_up is the fused gate-up + SiLU-and-mul launch in both GEMVs. Per-channel
scales, or 128-wide scale groups with --scale-group 128 (the W8A8 path then quantizes x per
group at every call). Then each tile's us summed over the four projections (the sum the
default tile is chosen by) and the projections' ms a token over the 8B's 32 layers.
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
FP8 = torch.float8_e4m3fn
NUM_LAYERS_8B = 32
# The projections whose input their producer (an RMSNorm) already quantized, at one row.
QUANTIZED_INPUTS = ("qkv", "gate_up")


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


def _one_row_calls(name: str, n: int, k: int, scale_group: int):
    """(weight ring size, bf16 GEMV call, W8A8 call, fp8 GEMV call for a tile), each taking a
    ring index, as batch-1 decode runs projection `name`."""
    from ladle.kernels.activation import silu_and_mul
    from ladle.kernels.fp8_gemv import fp8_gate_up_silu, fp8_gemv
    from ladle.kernels.fp8_matmul import decode_tile, grouped_tile
    from ladle.kernels.gemv import gate_up_silu, gemv
    from ladle.kernels.per_token_quant import per_group_quant, per_token_quant

    ring = max(2, -(-120_000_000 // (n * k)))
    codes = [(torch.randn(n, k, device="cuda") * 64).clamp(-448, 448).to(FP8) for _ in range(ring)]
    scale_shape = (n, -(-k // scale_group)) if scale_group else (n,)
    scales = [torch.rand(scale_shape, device="cuda") * 1e-3 + 1e-4 for _ in range(ring)]
    bf16_ring = max(2, -(-120_000_000 // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda").to(torch.bfloat16) / 64 for _ in range(bf16_ring)]
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    x_codes, x_scale = per_token_quant(x, FP8)
    gated, quantized = name == "gate_up", name in QUANTIZED_INPUTS

    def bf16(i):
        weight = weights[i % bf16_ring]
        return gate_up_silu(x, weight) if gated else gemv(x, weight)

    def w8a8(i):
        if scale_group:  # block layers quantize x per group at every call
            group_codes, group_scale = per_group_quant(x, FP8, scale_group)
            tile = grouped_tile(1, n, scale_group)
            out = fp8_matmul(group_codes, codes[i], group_scale, scales[i], tile, grouped=True)
        else:
            row_codes, row_scale = (x_codes, x_scale) if quantized else per_token_quant(x, FP8)
            out = fp8_matmul(row_codes, codes[i], row_scale, scales[i], decode_tile(1, n))
        return silu_and_mul(out) if gated else out

    def gemv_fp8(i, tile):
        row, row_scale = (x_codes, x_scale) if quantized else (x, None)
        if gated:
            return fp8_gate_up_silu(
                row, codes[i], scales[i], scale_group, row_scale, torch.bfloat16, tile
            )
        return fp8_gemv(
            row, codes[i], scales[i], scale_group, None, row_scale, torch.bfloat16, tile
        )

    return ring, bf16, w8a8, gemv_fp8


def one_row_main(args) -> None:
    """--one-row (see the module's docstring)."""
    from ladle.kernels.fp8_gemv import CANDIDATE_TILES, DEFAULT_TILE

    rows, totals = [], {tile: 0.0 for tile in CANDIDATE_TILES}
    sums = {"bf16_gemv": 0.0, "w8a8": 0.0, "fp8_gemv_default": 0.0}
    for name in args.shapes:
        n, k = SHAPES[name]
        ring, bf16, w8a8, gemv_fp8 = _one_row_calls(name, n, k, args.scale_group)
        calls = 24 if n * k < 100_000_000 else 8

        def timed(call, calls=calls, ring=ring):
            return calls_in_graph_us([functools.partial(call, i % ring) for i in range(calls)])

        bf16_us, w8a8_us = timed(bf16), timed(w8a8)
        reference = w8a8(0).float()
        tiles = {}
        for tile in CANDIDATE_TILES:
            us = timed(functools.partial(_tile_call, gemv_fp8, tile=tile))
            difference = (gemv_fp8(0, tile).float() - reference).norm() / reference.norm()
            tiles[tile] = {"us": round(us, 2), "tb_s": round(n * k / us / 1e6, 3)}
            tiles[tile]["rel_diff_from_w8a8"] = round(difference.item(), 4)
            totals[tile] += us
        best = min(tiles, key=lambda tile: tiles[tile]["us"])
        row = {
            "shape": name,
            "scale_group": args.scale_group,
            "bf16_gemv_us": round(bf16_us, 2),
            "bf16_gemv_tb_s": round(2 * n * k / bf16_us / 1e6, 3),
            "w8a8_us": round(w8a8_us, 2),
            "w8a8_tb_s": round(n * k / w8a8_us / 1e6, 3),
            "fp8_default_us": tiles[DEFAULT_TILE]["us"],
            "fp8_default_tb_s": tiles[DEFAULT_TILE]["tb_s"],
            "fp8_best_us": tiles[best]["us"],
            "fp8_best_tb_s": tiles[best]["tb_s"],
            "fp8_best_tile": str(best),
            "fp8_rel_diff_from_w8a8": tiles[best]["rel_diff_from_w8a8"],
        }
        sums["bf16_gemv"] += bf16_us
        sums["w8a8"] += w8a8_us
        sums["fp8_gemv_default"] += tiles[DEFAULT_TILE]["us"]
        print(json.dumps(row), flush=True)
        rows.append(row | {"all": {str(tile): value for tile, value in tiles.items()}})
        del bf16, w8a8, gemv_fp8
        torch.cuda.empty_cache()
    ranked = sorted(totals.items(), key=lambda item: item[1])
    sums["fp8_gemv_best"] = ranked[0][1]
    summary = {
        "us_per_layer": {key: round(us, 2) for key, us in sums.items()},
        "projections_ms_per_token": {
            key: round(us * NUM_LAYERS_8B / 1e3, 3) for key, us in sums.items()
        },
        "tiles_by_summed_us": [[str(tile), round(us, 2)] for tile, us in ranked[:8]],
    }
    print(json.dumps(summary, indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"rows": rows, "summary": summary}, handle, indent=1)


def _tile_call(gemv_fp8, index, tile):
    return gemv_fp8(index, tile)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--wide-tiles", action="store_true")
    parser.add_argument("--one-row", action="store_true", help="batch 1's GEMVs (docstring)")
    parser.add_argument("--scale-group", type=int, default=0, choices=(0, 128))
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.one_row:
        one_row_main(args)
        return
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
