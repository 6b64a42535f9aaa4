"""SiLU-and-multiply in one launch: out[..., d] = silu(x[..., :d]) * x[..., d:].

Same rounding as the torch layer: silu is computed in float32 (with the accurate exp and
division, as torch's kernel does) and rounded to the dtype, then multiplied by up and rounded.
Grid: (rows, column blocks), so wide MLPs fill the GPU at batch 1 too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ladle.kernels.pdl import enter_dependent_launch, pdl_launch


@triton.jit
def _silu_and_mul_kernel(
    output_ptr,
    input_ptr,
    width,
    stride_input_row,
    stride_output_row,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    enter_dependent_launch(USE_PDL)  # kernels/pdl.py
    row = tl.program_id(0).to(tl.int64)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    is_column = columns < width
    dtype = output_ptr.dtype.element_ty
    row_input = input_ptr + row * stride_input_row
    gate = tl.load(row_input + columns, mask=is_column, other=0.0).to(tl.float32)
    up = tl.load(row_input + width + columns, mask=is_column, other=0.0).to(tl.float32)
    silu = tl.math.div_rn(gate, 1.0 + libdevice.exp(-gate)).to(dtype).to(tl.float32)
    tl.store(output_ptr + row * stride_output_row + columns, (silu * up).to(dtype), mask=is_column)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2 * d] (last dim contiguous) -> [..., d]."""
    width = x.shape[-1] // 2
    output = torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)
    if output.numel() == 0:
        return output
    rows = x.reshape(-1, x.shape[-1]) if x.stride(-1) == 1 else x.contiguous().view(-1, 2 * width)
    output_rows = output.view(-1, width)
    block = min(1024, max(64, triton.next_power_of_2(width)))
    grid = (rows.shape[0], triton.cdiv(width, block))
    _silu_and_mul_kernel[grid](
        output_rows,
        rows,
        width,
        rows.stride(0),
        output_rows.stride(0),
        BLOCK=block,
        num_warps=4,
        **pdl_launch(x.device, rows.shape[0]),
    )
    return output
