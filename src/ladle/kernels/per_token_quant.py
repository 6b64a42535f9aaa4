"""Per-token activation quantization in one launch: each row's max |x| becomes its scale, the
row is multiplied by its reciprocal and rounded to float8 e4m3 or int8. Five torch launches
(abs, amax, divide, clamp, cast) become one, which matters in decode where every Linear
quantizes a few rows.

    scale[m] = max(max_k |x[m, k]|, tiny) / QMAX          (448 for e4m3, 127 for int8)
    codes[m, k] = cast(clamp(x[m, k] * (1 / scale[m])))    (int8: round half to even first)

One program per row, the row held in registers (hidden sizes up to 32k). per_group_quant
applies the same rule to each group of columns of a row on its own (the activations of
block-scaled fp8 checkpoints), one program per row and group; both are one kernel, per token
being a single group as wide as the row. The torch reference (and the
rule's constants) is kernels/per_token_rule.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ladle.kernels.pdl import enter_dependent_launch, pdl_launch
from ladle.kernels.per_token_rule import quant_max


@triton.jit
def store_quantized_row(
    codes_pointers, scale_pointer, x, is_column, QMAX: tl.constexpr, IS_INT: tl.constexpr
):
    """Quantize one float32 row x held in registers (padding columns 0): its codes stored at
    codes_pointers (where is_column), its scale at scale_pointer.

    Every kernel that quantizes a row it holds ends with this (this module's, RMSNorm's and
    SiLU-and-mul's for an fp8 projection), so their codes and scales are the same bits on the
    same row.
    """
    # The scale as torch computes a tensor / scalar (times the float32 reciprocal), and the
    # codes as x times the row's IEEE-rounded reciprocal (one division a row, where Triton's `/`
    # is approximate): the same float32 bits as the torch reference's, so the same codes, where
    # a product one ulp off next to a rounding boundary would flip a code by one. An IEEE
    # division per element instead bound the kernel at wide rows: 8.5 -> 5.2 us at 256 x 14336
    # on an H100 (scripts/act_quant_probe.py).
    scale = tl.maximum(tl.max(tl.abs(x), axis=0) * (1.0 / QMAX), 1e-12)  # per_token_rule.MIN_SCALE
    scaled = tl.clamp(x * tl.math.div_rn(1.0, scale), -QMAX, QMAX)
    if IS_INT:
        scaled = libdevice.rint(scaled)
    tl.store(codes_pointers, scaled.to(codes_pointers.dtype.element_ty), mask=is_column)
    tl.store(scale_pointer, scale)


@triton.jit
def _per_group_quant_kernel(
    codes_ptr,
    scale_ptr,
    input_ptr,
    stride_input,
    stride_codes,
    num_columns,
    num_groups,
    QMAX: tl.constexpr,
    IS_INT: tl.constexpr,
    GROUP: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    enter_dependent_launch(USE_PDL)  # kernels/pdl.py
    row = tl.program_id(0).to(tl.int64)
    group = tl.program_id(1)
    columns = group * GROUP + tl.arange(0, GROUP)
    is_column = columns < num_columns
    x = tl.load(input_ptr + row * stride_input + columns, mask=is_column, other=0.0)
    store_quantized_row(
        codes_ptr + row * stride_codes + columns,
        scale_ptr + row * num_groups + group,
        x.to(tl.float32),
        is_column,
        QMAX,
        IS_INT,
    )


def per_token_quant(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (CUDA, row-contiguous) -> (codes [M, K] of dtype, float32 scales [M, 1])."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"per_token_quant needs a row-contiguous [M, K] matrix, got {x.shape}")
    block = triton.next_power_of_2(x.shape[1])
    # 16 warps from 4096 columns: at the 8B's o input (4096) 3.75 -> 3.24 us at 256 rows and
    # 2.69 -> 2.17 at 64 against 4 warps (scripts/per_token_quant_warps.py on an H100).
    return _quantize_groups(x, dtype, block, num_warps=max(1, min(16, block // 256)))


def per_group_quant(
    x: torch.Tensor, dtype: torch.dtype, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (CUDA, row-contiguous) -> (codes [M, K] of dtype, float32 scales
    [M, ceil(K / group_size)]): each group of columns of a row quantized on its own by the
    per-token rule (per_token_rule.per_group_quant_reference), one program per row and group."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"per_group_quant needs a row-contiguous [M, K] matrix, got {x.shape}")
    if group_size & (group_size - 1):
        raise ValueError(f"per_group_quant needs a power-of-two group size, got {group_size}")
    return _quantize_groups(x, dtype, group_size, num_warps=1 if group_size <= 128 else 4)


def _quantize_groups(
    x: torch.Tensor, dtype: torch.dtype, group_size: int, num_warps: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One launch of the kernel over every row and group of group_size columns (a power of two;
    per token: the row's next power of two, one group)."""
    num_rows, num_columns = x.shape
    num_groups = triton.cdiv(num_columns, group_size)
    codes = torch.empty(num_rows, num_columns, dtype=dtype, device=x.device)
    scale = torch.empty(num_rows, num_groups, dtype=torch.float32, device=x.device)
    if num_rows == 0:
        return codes, scale
    _per_group_quant_kernel[(num_rows, num_groups)](
        codes,
        scale,
        x,
        x.stride(0),
        codes.stride(0),
        num_columns,
        num_groups,
        QMAX=quant_max(dtype),
        IS_INT=dtype == torch.int8,
        GROUP=group_size,
        num_warps=num_warps,
        **pdl_launch(x.device, num_rows),
    )
    return codes, scale
