"""Is per-token quantization (and the SiLU-and-mul before down) bound by its arithmetic? At the 8B's
decode shapes: each element divided by the row's scale (IEEE, ladle's rule before session 9)
against ladle's per_token_quant (times the row's reciprocal; its warps: per_token_quant_warps.py),
and ladle's silu_and_mul + per_token_quant against its one-launch silu_and_mul_quant. us per call
from a CUDA graph, inputs from a ring larger than L2; also the share of codes the rules disagree
on.
Prints one JSON line per case.

    python scripts/act_quant_probe.py
"""

from __future__ import annotations

import functools
import json

import torch
import triton
import triton.language as tl

from ladle.bench.gpu_timing import calls_in_graph_us, input_ring
from ladle.kernels.activation import silu_and_mul, silu_and_mul_quant
from ladle.kernels.per_token_quant import per_token_quant

E4M3 = torch.float8_e4m3fn


@triton.jit
def _division_quant_kernel(codes_ptr, scale_ptr, input_ptr, num_columns, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    is_column = columns < num_columns
    x = tl.load(input_ptr + row * num_columns + columns, mask=is_column, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) * (1.0 / 448.0), 1e-12)
    scaled = tl.clamp(tl.math.div_rn(x, scale), -448.0, 448.0)
    codes = scaled.to(codes_ptr.dtype.element_ty)
    tl.store(codes_ptr + row * num_columns + columns, codes, mask=is_column)
    tl.store(scale_ptr + row, scale)


def division_quant(x, codes, scale):
    block = triton.next_power_of_2(x.shape[1])
    _division_quant_kernel[(x.shape[0],)](
        codes, scale, x, x.shape[1], BLOCK=block, num_warps=max(1, min(16, block // 256))
    )


def time_cases(cases: dict, inputs: list[torch.Tensor], **fields) -> None:
    """One JSON line per case: us per call over 24 calls on the ring's inputs in turn."""
    for name, fn in cases.items():
        calls = [functools.partial(fn, inputs[i % len(inputs)]) for i in range(24)]
        record = {**fields, "case": name, "us": calls_in_graph_us(calls)}
        print(json.dumps(record), flush=True)


def main() -> None:
    for rows in (64, 128, 256):
        for width in (4096, 14336):
            inputs = input_ring(rows, width)
            codes = torch.empty(rows, width, dtype=E4M3, device="cuda")
            scale = torch.empty(rows, 1, device="cuda")
            division_quant(inputs[0], codes, scale)
            ladle_codes, _ = per_token_quant(inputs[0], E4M3)
            disagree = (ladle_codes.view(torch.uint8) != codes.view(torch.uint8)).float().mean()
            cases = {
                "division": functools.partial(division_quant, codes=codes, scale=scale),
                "reciprocal (ladle)": lambda x: per_token_quant(x, E4M3),
            }
            fields = {"kind": "quant", "rows": rows, "width": width}
            time_cases(cases, inputs, **fields, codes_disagree=disagree.item())
        cases = {
            "silu_and_mul alone": silu_and_mul,
            "silu_and_mul + per_token_quant": lambda x: per_token_quant(silu_and_mul(x), E4M3),
            "silu_and_mul_quant (ladle)": lambda x: silu_and_mul_quant(x, E4M3),
        }
        time_cases(cases, input_ring(rows, 2 * 14336), kind="silu", rows=rows, width=14336)


if __name__ == "__main__":
    main()
