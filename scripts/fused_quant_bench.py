"""The fp8 activation quantization fused into its producer, kernel by kernel (issue 12, W2 fp8).

    python scripts/fused_quant_bench.py [--rows 1 16 64 256]

For the 8B's shapes, microseconds per call, replayed from a CUDA graph (ladle.bench.gpu_timing),
of each producer followed by per_token_quant (today's pair, two launches) against the fused
launch (rms_norm_quant / silu_and_mul_quant): the residual-add RMSNorm over 4096 columns (the
decoder's two norms) and SiLU-and-mul over 2 x 14336 (before down). Random bf16 inputs, a ring
of 8 input buffers per call list so consecutive calls do not reread one buffer. One JSON line
per (kernel, rows), and the saving per 8B decode step (31 fp8 layers x 2 norms + 1 SiLU).
"""

from __future__ import annotations

import argparse
import json

import torch

from ladle.bench.gpu_timing import calls_in_graph_us

RING = 8
# 32 layers, the last in bf16 (KEEP_LAST_LAYERS): 31 with fp8 projections.
HIDDEN, INTERMEDIATE, FP8_LAYERS = 4096, 14336, 31


def _norm_calls(rows: int, fused: bool) -> list:
    from ladle.kernels.per_token_quant import per_token_quant
    from ladle.kernels.rms_norm import rms_norm, rms_norm_quant

    e4m3 = torch.float8_e4m3fn
    weight = (1 + 0.1 * torch.randn(HIDDEN, device="cuda")).to(torch.bfloat16)
    inputs = [torch.randn(rows, HIDDEN, device="cuda").to(torch.bfloat16) for _ in range(RING)]
    residuals = [torch.randn(rows, HIDDEN, device="cuda").to(torch.bfloat16) for _ in range(RING)]
    if fused:
        return [
            lambda x=x, r=r: rms_norm_quant(x, weight, 1e-5, e4m3, residual=r)
            for x, r in zip(inputs, residuals, strict=True)
        ]
    return [
        lambda x=x, r=r: per_token_quant(rms_norm(x, weight, 1e-5, residual=r), e4m3)
        for x, r in zip(inputs, residuals, strict=True)
    ]


def _silu_calls(rows: int, fused: bool) -> list:
    from ladle.kernels.activation import silu_and_mul, silu_and_mul_quant
    from ladle.kernels.per_token_quant import per_token_quant

    e4m3 = torch.float8_e4m3fn
    inputs = [
        (torch.randn(rows, 2 * INTERMEDIATE, device="cuda") * 2).to(torch.bfloat16)
        for _ in range(RING)
    ]
    if fused:
        return [lambda x=x: silu_and_mul_quant(x, e4m3) for x in inputs]
    return [lambda x=x: per_token_quant(silu_and_mul(x), e4m3) for x in inputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 256])
    args = parser.parse_args()
    for rows in args.rows:
        step_us = {}
        for kernel, make_calls, per_layer in (
            ("rms_norm+residual", _norm_calls, 2),
            ("silu_and_mul", _silu_calls, 1),
        ):
            pair = calls_in_graph_us(make_calls(rows, fused=False))
            fused = calls_in_graph_us(make_calls(rows, fused=True))
            step_us[kernel] = (pair - fused) * per_layer * FP8_LAYERS
            print(
                json.dumps(
                    {
                        "kernel": kernel,
                        "rows": rows,
                        "pair_us": round(pair, 2),
                        "fused_us": round(fused, 2),
                    }
                ),
                flush=True,
            )
        print(
            json.dumps({"rows": rows, "saved_us_per_8b_step": round(sum(step_us.values()), 1)}),
            flush=True,
        )


if __name__ == "__main__":
    main()
