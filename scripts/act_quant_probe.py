"""Is per_token_quant (and the SiLU-and-mul before down) bound by its arithmetic? At the 8B's decode
shapes: ladle's per_token_quant (IEEE division per element) against a variant that multiplies by
the row's reciprocal, ladle's silu_and_mul + per_token_quant against one fused launch per row
(reciprocal), us per call from a CUDA graph with inputs from a ring larger than L2. Also checks
how many codes the reciprocal changes. Prints one JSON line per case.

    python scripts/act_quant_probe.py
"""

from __future__ import annotations

import functools
import json

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ladle.bench.gpu_timing import calls_in_graph_us
from ladle.kernels.activation import silu_and_mul
from ladle.kernels.per_token_quant import per_token_quant

QMAX = 448.0


@triton.jit
def _reciprocal_quant_kernel(codes_ptr, scale_ptr, input_ptr, num_columns, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    is_column = columns < num_columns
    x = tl.load(input_ptr + row * num_columns + columns, mask=is_column, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) * (1.0 / 448.0), 1e-12)
    inverse = tl.math.div_rn(1.0, scale)
    scaled = tl.clamp(x * inverse, -448.0, 448.0)
    tl.store(
        codes_ptr + row * num_columns + columns,
        scaled.to(codes_ptr.dtype.element_ty),
        mask=is_column,
    )
    tl.store(scale_ptr + row, scale)


@triton.jit
def _fused_silu_quant_kernel(codes_ptr, scale_ptr, input_ptr, width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    is_column = columns < width
    row_input = input_ptr + row * 2 * width
    gate = tl.load(row_input + columns, mask=is_column, other=0.0).to(tl.float32)
    up = tl.load(row_input + width + columns, mask=is_column, other=0.0).to(tl.float32)
    silu = tl.math.div_rn(gate, 1.0 + libdevice.exp(-gate)).to(tl.bfloat16).to(tl.float32)
    x = (silu * up).to(tl.bfloat16).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) * (1.0 / 448.0), 1e-12)
    inverse = tl.math.div_rn(1.0, scale)
    scaled = tl.clamp(x * inverse, -448.0, 448.0)
    tl.store(
        codes_ptr + row * width + columns, scaled.to(codes_ptr.dtype.element_ty), mask=is_column
    )
    tl.store(scale_ptr + row, scale)


def reciprocal_quant(x, codes, scale, num_warps):
    _reciprocal_quant_kernel[(x.shape[0],)](
        codes, scale, x, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]), num_warps=num_warps
    )


def fused_silu_quant(x, codes, scale, num_warps):
    width = x.shape[1] // 2
    _fused_silu_quant_kernel[(x.shape[0],)](
        codes, scale, x, width, BLOCK=triton.next_power_of_2(width), num_warps=num_warps
    )


def pair(x):
    per_token_quant(silu_and_mul(x), torch.float8_e4m3fn)


def main() -> None:
    for rows in (64, 128, 256):
        for width in (4096, 14336):
            ring = max(4, 64_000_000 // (rows * width * 2))
            inputs = [torch.randn(rows, width, device="cuda").bfloat16() for _ in range(ring)]
            codes = torch.empty(rows, width, dtype=torch.float8_e4m3fn, device="cuda")
            scale = torch.empty(rows, 1, device="cuda")
            exact, _ = per_token_quant(inputs[0], torch.float8_e4m3fn)
            reciprocal_quant(inputs[0], codes, scale, 16)
            changed = (exact.view(torch.uint8) != codes.view(torch.uint8)).float().mean().item()
            cases = {"div_rn (ladle)": lambda x: per_token_quant(x, torch.float8_e4m3fn)}
            for warps in (8, 16, 32):
                cases[f"reciprocal w{warps}"] = functools.partial(
                    reciprocal_quant, codes=codes, scale=scale, num_warps=warps
                )
            for name, fn in cases.items():
                calls = [functools.partial(fn, inputs[i % ring]) for i in range(24)]
                us = calls_in_graph_us(calls)
                print(
                    json.dumps(
                        {
                            "kind": "quant",
                            "rows": rows,
                            "width": width,
                            "case": name,
                            "us": us,
                            "codes_changed": changed,
                        }
                    ),
                    flush=True,
                )
        width = 14336
        ring = max(4, 64_000_000 // (rows * width * 4))
        inputs = [torch.randn(rows, 2 * width, device="cuda").bfloat16() for _ in range(ring)]
        codes = torch.empty(rows, width, dtype=torch.float8_e4m3fn, device="cuda")
        scale = torch.empty(rows, 1, device="cuda")
        cases = {"silu_and_mul alone": silu_and_mul, "silu_and_mul + per_token_quant": pair}
        for warps in (16, 32):
            cases[f"fused reciprocal w{warps}"] = functools.partial(
                fused_silu_quant, codes=codes, scale=scale, num_warps=warps
            )
        for name, fn in cases.items():
            calls = [functools.partial(fn, inputs[i % ring]) for i in range(24)]
            us = calls_in_graph_us(calls)
            print(
                json.dumps({"kind": "silu", "rows": rows, "width": width, "case": name, "us": us}),
                flush=True,
            )


if __name__ == "__main__":
    main()
