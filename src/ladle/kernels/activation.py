"""SiLU-and-multiply in one launch: out[..., d] = silu(x[..., :d]) * x[..., d:].

Same rounding as the torch layer: silu is computed in float32 (with the accurate exp and
division, as torch's kernel does) and rounded to the dtype, then multiplied by up and rounded.
Grid: (rows, column blocks), so wide MLPs fill the GPU at batch 1 too.

silu_and_mul_quant is the same product for an output that feeds an fp8 (or int8) projection (the
down projection) at batches of 64 rows and more: one program per row holds the whole row in
registers, quantizes it per token there (per_token_quant.store_quantized_row) and writes only
its codes and scale, the same bits as silu_and_mul then per_token_quant in one launch. On an
H100 at the 8B's 14336 columns (scripts/act_quant_probe.py): 64 rows 8.7 -> 5.8 us, 256 rows
14.4 -> 10.3 us, on 32 warps. Fewer rows leave most SMs idle (one row per program) and keep the
pair; so did the first fused version of this (4 or 16 warps, and an IEEE division per element
that bound it: 18.6 us at 256 rows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ladle.kernels.pdl import enter_dependent_launch, pdl_launch
from ladle.kernels.per_token_quant import quant_max, store_quantized_row

# silu_and_mul_quant's domain: at least this many rows (below, the pair is faster), rows that fit
# one program's registers.
FUSED_QUANT_MIN_ROWS = 64
FUSED_QUANT_MAX_WIDTH = 32768


@triton.jit
def silu_times_up(gate, up, dtype: tl.constexpr):
    """silu(gate) * up from float32 inputs with torch's roundings to `dtype` (silu, then the
    product)."""
    silu = tl.math.div_rn(gate, 1.0 + libdevice.exp(-gate)).to(dtype).to(tl.float32)
    return (silu * up).to(dtype)


@triton.jit
def gate_up_rows(WIDTH, BLOCK_N: tl.constexpr):
    """The rows of a merged [gate; up] weight (2 * WIDTH rows) that program_id(0)'s BLOCK_N
    features read as one tile, gate and up interleaved (w[j], w[WIDTH + j], ...), and which of
    them exist: the one-row GEMVs' fused gate-up (kernels/gemv.py, fp8_gemv.py)."""
    pairs = tl.arange(0, 2 * BLOCK_N)
    features = tl.program_id(0) * BLOCK_N + pairs // 2
    return features + (pairs % 2) * WIDTH, features < WIDTH


@triton.jit
def store_silu_of_pairs(out_ptr, projected, WIDTH, BLOCK_N: tl.constexpr):
    """silu(gate) * up of gate_up_rows' float32 products, stored for program_id(0)'s features.
    Each projection is first rounded to the output dtype, as the projection would store it and
    SiLU-and-mul read it back on the path of two launches."""
    rounded = projected.to(out_ptr.dtype.element_ty).to(tl.float32)
    gate, up = tl.split(tl.reshape(rounded, (BLOCK_N, 2)))
    output = silu_times_up(gate, up, out_ptr.dtype.element_ty)
    outputs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + outputs, output, mask=outputs < WIDTH)


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
    output = silu_times_up(gate, up, dtype)
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
    USE_PDL: tl.constexpr = False,
):
    enter_dependent_launch(USE_PDL)  # kernels/pdl.py
    row = tl.program_id(0).to(tl.int64)
    columns = tl.arange(0, BLOCK)
    is_column = columns < width
    row_input = input_ptr + row * stride_input_row
    gate = tl.load(row_input + columns, mask=is_column, other=0.0).to(tl.float32)
    up = tl.load(row_input + width + columns, mask=is_column, other=0.0).to(tl.float32)
    # Padding columns give silu(0) * 0 = 0, which leaves the row's max alone.
    output = silu_times_up(gate, up, input_ptr.dtype.element_ty).to(tl.float32)
    store_quantized_row(
        codes_ptr + row * stride_codes_row + columns,
        scale_ptr + row,
        output,
        is_column,
        QMAX,
        IS_INT,
    )


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


def silu_and_mul_quant_applies(x: torch.Tensor) -> bool:
    """Whether silu_and_mul_quant takes x (else the caller runs the pair): a [M, 2 * d] matrix
    with contiguous rows, M >= FUSED_QUANT_MIN_ROWS, d <= FUSED_QUANT_MAX_WIDTH."""
    return (
        x.dim() == 2
        and x.stride(1) == 1
        and x.shape[1] % 2 == 0
        and x.shape[0] >= FUSED_QUANT_MIN_ROWS
        and x.shape[1] // 2 <= FUSED_QUANT_MAX_WIDTH
    )


def silu_and_mul_quant(
    x: torch.Tensor, code_dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_quant(silu_and_mul(x), code_dtype) in one launch: x [M, 2 * d] with contiguous
    rows (d <= FUSED_QUANT_MAX_WIDTH) -> (codes [M, d] of code_dtype, float32 scales [M, 1]), bit
    for bit. Any M works; below FUSED_QUANT_MIN_ROWS the pair is faster."""
    if x.dim() != 2 or x.stride(1) != 1 or x.shape[1] % 2:
        raise ValueError(
            f"silu_and_mul_quant needs a row-contiguous [M, 2 * d] matrix, got {tuple(x.shape)}"
        )
    num_rows, width = x.shape[0], x.shape[1] // 2
    if width > FUSED_QUANT_MAX_WIDTH:
        raise ValueError(
            f"silu_and_mul_quant holds a row in registers: d = {width} > {FUSED_QUANT_MAX_WIDTH}"
        )
    qmax = quant_max(code_dtype)
    codes = torch.empty(num_rows, width, dtype=code_dtype, device=x.device)
    scale = torch.empty(num_rows, 1, dtype=torch.float32, device=x.device)
    if num_rows == 0 or width == 0:
        return codes, scale
    block = triton.next_power_of_2(width)
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
        # 16 columns a thread: 32 warps at the 8B's 14336 (16 warps: 13.1 against 10.3 us at 256
        # rows on an H100).
        num_warps=max(1, min(32, block // 512)),
        **pdl_launch(x.device, num_rows),
    )
    return codes, scale
