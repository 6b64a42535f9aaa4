"""SiLU-and-multiply in one launch: out[..., d] = silu(x[..., :d]) * x[..., d:].

Same rounding as the torch layer: silu is computed in float32 (with the accurate exp and
division, as torch's kernel does) and rounded to the dtype, then multiplied by up and rounded.
Grid: (rows, column blocks), so wide MLPs fill the GPU at batch 1 too.

silu_and_mul_quant is the same product for an output that feeds an fp8 (or int8) projection (the
down projection): one program per row holds the whole row, quantizes it per token in registers
(per_token_quant.quantize_row) and writes only its codes and scale; the same bits as
silu_and_mul then per_token_quant, in one launch instead of two.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ladle.kernels.per_token_quant import codes_at_scale, quant_max, scale_of_max


@triton.jit
def _silu_times_up(gate, up, dtype: tl.constexpr):
    """silu(gate) * up in float32 with torch's roundings to `dtype` (silu, then the product)."""
    silu = tl.math.div_rn(gate, 1.0 + libdevice.exp(-gate)).to(dtype).to(tl.float32)
    return (silu * up).to(dtype)


@triton.jit
def _silu_and_mul_kernel(
    output_ptr,
    input_ptr,
    width,
    stride_input_row,
    stride_output_row,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    is_column = columns < width
    dtype = output_ptr.dtype.element_ty
    row_input = input_ptr + row * stride_input_row
    gate = tl.load(row_input + columns, mask=is_column, other=0.0).to(tl.float32)
    up = tl.load(row_input + width + columns, mask=is_column, other=0.0).to(tl.float32)
    output = _silu_times_up(gate, up, dtype)
    tl.store(output_ptr + row * stride_output_row + columns, output, mask=is_column)


@triton.jit
def _silu_and_mul_quant_kernel(
    codes_ptr,
    scale_ptr,
    input_ptr,
    width,
    stride_input_row,
    stride_codes_row,
    QMAX: tl.constexpr,
    IS_INT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One row in BLOCK-column chunks, twice: the first pass finds the row's max |output|, the
    second recomputes each chunk's output (the same instructions, so the same bits) and stores
    its codes. Holding a 14336-wide row in one program's registers instead took 16 warps and
    left one program per SM: slower than the unfused pair (18.6 against 14.7 us at 256 rows,
    scripts/fused_quant_bench.py); chunks on 4 warps let several rows share an SM."""
    row = tl.program_id(0).to(tl.int64)
    dtype = input_ptr.dtype.element_ty
    row_input = input_ptr + row * stride_input_row
    row_max = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, width, BLOCK):
        columns = start + tl.arange(0, BLOCK)
        is_column = columns < width
        gate = tl.load(row_input + columns, mask=is_column, other=0.0).to(tl.float32)
        up = tl.load(row_input + width + columns, mask=is_column, other=0.0).to(tl.float32)
        # Padding columns give silu(0) * 0 = 0, which leaves the row's max alone.
        output = _silu_times_up(gate, up, dtype).to(tl.float32)
        row_max = tl.maximum(row_max, tl.abs(output))
    # quantize_row's scale (a max is exact in any order), then its codes chunk by chunk.
    scale = scale_of_max(tl.max(row_max, axis=0), QMAX)
    for start in range(0, width, BLOCK):
        columns = start + tl.arange(0, BLOCK)
        is_column = columns < width
        gate = tl.load(row_input + columns, mask=is_column, other=0.0).to(tl.float32)
        up = tl.load(row_input + width + columns, mask=is_column, other=0.0).to(tl.float32)
        output = _silu_times_up(gate, up, dtype).to(tl.float32)
        scaled = codes_at_scale(output, scale, QMAX, IS_INT)
        tl.store(
            codes_ptr + row * stride_codes_row + columns,
            scaled.to(codes_ptr.dtype.element_ty),
            mask=is_column,
        )
    tl.store(scale_ptr + row, scale)


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
        output_rows, rows, width, rows.stride(0), output_rows.stride(0), BLOCK=block, num_warps=4
    )
    return output


def silu_and_mul_quant(
    x: torch.Tensor, code_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_quant(silu_and_mul(x), code_dtype) in one launch: x [M, 2 * d] with contiguous
    rows -> (codes [M, d] of code_dtype, float32 scales [M, 1]), bit for bit."""
    if x.dim() != 2 or x.stride(1) != 1 or x.shape[1] % 2:
        raise ValueError(
            f"silu_and_mul_quant needs a row-contiguous [M, 2 * d] matrix, got {tuple(x.shape)}"
        )
    qmax = quant_max(code_dtype)
    num_rows, width = x.shape[0], x.shape[1] // 2
    codes = torch.empty(num_rows, width, dtype=code_dtype, device=x.device)
    scale = torch.empty(num_rows, 1, dtype=torch.float32, device=x.device)
    if num_rows == 0 or width == 0:
        return codes, scale
    block = min(2048, triton.next_power_of_2(width))
    _silu_and_mul_quant_kernel[(num_rows,)](
        codes,
        scale,
        x,
        width,
        x.stride(0),
        codes.stride(0),
        QMAX=qmax,
        IS_INT=code_dtype == torch.int8,
        BLOCK=block,
        num_warps=4,
    )
    return codes, scale
