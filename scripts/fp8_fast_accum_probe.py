"""cuBLASLt's row-wise fp8 GEMM (torch._scaled_mm) with and without fast accumulation on the
8B's projections at 64-512 rows: us per call in a CUDA graph over a weight ring larger than L2,
and the relative error against float32 over the same codes. One JSON line per case.

    python scripts/fp8_fast_accum_probe.py
"""

from __future__ import annotations

import functools
import json

import torch
from fp8_tile_precision_probe import SHAPES, fp8_operands  # this folder, on sys.path

from ladle.bench.gpu_timing import calls_in_graph_us


def main() -> None:
    for name, (n, k) in SHAPES.items():
        generator = torch.Generator(device="cuda").manual_seed(n + k)
        weights, w_scale, calls, activations = fp8_operands(n, k, generator)
        ring, w_scale = len(weights), w_scale[None, :]
        for tokens in (64, 128, 256, 512):
            x_codes, x_scale = activations(tokens)
            expected = (x_codes.float() * x_scale) @ (weights[0].float() * w_scale.t()).t()
            for fast in (False, True):

                def call(weight, fast=fast, x_codes=x_codes, x_scale=x_scale, w_scale=w_scale):
                    return torch._scaled_mm(
                        x_codes,
                        weight.t(),
                        scale_a=x_scale,
                        scale_b=w_scale,
                        out_dtype=torch.bfloat16,
                        use_fast_accum=fast,
                    )

                got = call(weights[0]).float()
                error = ((got - expected).norm() / expected.norm()).item()
                us = calls_in_graph_us(
                    [functools.partial(call, weights[i % ring]) for i in range(calls)], replays=3
                )
                row = {"shape": name, "tokens": tokens, "fast": fast, "us": round(us, 2)}
                print(json.dumps({**row, "rel_err": error}), flush=True)
        del weights
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
