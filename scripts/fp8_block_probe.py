"""Which cuBLASLt block-scaled recipe, and which decode tile, for block fp8 (quant/fp8_block.py):
torch._scaled_mm with 1x128 activation scales against 128x128 weight blocks or against per-row
1x128 weight groups (the canonical layout itself), rows padded to a multiple of 4; and the
grouped Triton kernel's decode tiles (16 rows; 32-128 columns; 3-5 stages), per projection of
the 8B shape. us per call in one CUDA graph (scripts/fp8_block_bench.py's method).

    python scripts/fp8_block_probe.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from ladle.bench.gpu_timing import PROJECTIONS_8B, WEIGHT_RING_BYTES, calls_in_graph_us
from ladle.kernels.fp8_matmul import Fp8Tile, fp8_matmul
from ladle.kernels.per_token_quant import per_group_quant
from ladle.model.layers.quant.fp8_block import (
    block_scaled_mm,
    cublas_weight_scales,
    quantize_fp8_blocks,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows_out = []
    for name, (n, k) in PROJECTIONS_8B.items():
        count = max(2, WEIGHT_RING_BYTES // (n * k))
        weights = [
            quantize_fp8_blocks(torch.randn(n, k, device="cuda") * 0.02, 128, 128)
            for _ in range(count)
        ]
        blocks = [cublas_weight_scales(scale, 128, 128) for _, scale in weights]
        rowwise = [scale.t().contiguous().t() for _, scale in weights]
        for tokens in (1, 4, 16, 32, 64, 256, 4096):
            x = torch.randn(tokens, k, device="cuda").bfloat16()
            row = {"shape": name, "tokens": tokens}
            reference = None
            for recipe, scales in (("block128", blocks), ("rowwise", rowwise)):
                try:
                    got = block_scaled_mm(x, weights[0][0], scales[0]).float()
                    if reference is None:
                        codes, xs = per_group_quant(x, torch.float8_e4m3fn, 128)
                        tile = Fp8Tile(64, 64, 128)
                        reference = fp8_matmul(
                            codes, weights[0][0], xs, weights[0][1], tile, grouped=True
                        ).float()
                    diff = ((got - reference).norm() / reference.norm()).item()
                    calls = [
                        lambda w=w, s=s, x=x: block_scaled_mm(x, w, s)
                        for (w, _), s in zip(weights, scales)
                    ]
                    row[recipe + "_us"] = round(calls_in_graph_us(calls), 2)
                    row[recipe + "_diff"] = round(diff, 5)
                except RuntimeError as error:
                    row[recipe + "_error"] = str(error).splitlines()[0][:80]
            if tokens <= 32:
                for block_n in (32, 64, 128):
                    for stages in (3, 4, 5):
                        tile = Fp8Tile(16, block_n, 128, num_warps=4, num_stages=stages)

                        def call(w=None, s=None, x=x, tile=tile):
                            codes, xs = per_group_quant(x, torch.float8_e4m3fn, 128)
                            return fp8_matmul(codes, w, xs, s, tile, grouped=True)

                        calls = [lambda w=w, s=s, call=call: call(w, s) for w, s in weights]
                        row[f"triton_16x{block_n}x128_s{stages}_us"] = round(
                            calls_in_graph_us(calls), 2
                        )
            print(json.dumps(row), flush=True)
            rows_out.append(row)
        del weights, blocks, rowwise
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows_out, handle, indent=1)


if __name__ == "__main__":
    main()
