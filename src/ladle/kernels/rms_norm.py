"""RMSNorm in one launch, optionally fused with the residual add; also Qwen3's per-head q/k norm.

Same rounding as the torch layer (model/layers/norm.py, which follows HF): the residual sum is
rounded to the input dtype before it is normalised, the normalised row is rounded to the input
dtype before the weight multiply, and the product is rounded to the output dtype. Only the
variance's summation order differs from torch's.

One program per row. Rows are addressed as (token, head) with two strides, so a strided
[num_tokens, num_heads, head_dim] view of the merged qkv output is normalised per head without a
copy; a plain [num_tokens, hidden] tensor is the case num_heads = 1. The torch reference is
RMSNorm's own torch path.

rms_norm_quant is the same launch for a norm whose output feeds an fp8 (or int8) projection: the
normalised row, rounded to the input dtype exactly as rms_norm returns it, is quantized per token
in registers (per_token_quant.store_quantized_row) and only its codes and scale are written; the
same bits as rms_norm then per_token_quant, one launch and one bf16 round trip through memory
fewer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ladle.kernels.pdl import enter_dependent_launch, pdl_launch
from ladle.kernels.per_token_quant import quant_max, store_quantized_row


@triton.jit
def _rms_norm_kernel(
    output_ptr,
    scale_ptr,
    input_ptr,
    residual_ptr,
    weight_ptr,
    num_heads,
    stride_input_token,
    stride_input_head,
    stride_output_token,
    stride_output_head,
    stride_residual_token,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    QUANTIZE: tl.constexpr,
    QMAX: tl.constexpr,
    IS_INT: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    enter_dependent_launch(USE_PDL)  # kernels/pdl.py
    row = tl.program_id(0)
    token = (row // num_heads).to(tl.int64)
    head = row % num_heads
    columns = tl.arange(0, BLOCK)
    is_column = columns < HIDDEN
    input_dtype = input_ptr.dtype.element_ty
    x = tl.load(
        input_ptr + token * stride_input_token + head * stride_input_head + columns,
        mask=is_column,
        other=0.0,
    ).to(tl.float32)
    if HAS_RESIDUAL:
        residual_pointers = residual_ptr + token * stride_residual_token + columns
        residual = tl.load(residual_pointers, mask=is_column, other=0.0).to(tl.float32)
        summed = (x + residual).to(input_dtype)
        tl.store(residual_pointers, summed, mask=is_column)
        x = summed.to(tl.float32)
    variance = tl.sum(x * x, axis=0) / HIDDEN
    normalized = (x * tl.rsqrt(variance + eps)).to(input_dtype).to(tl.float32)
    weight = tl.load(weight_ptr + columns, mask=is_column, other=0.0).to(tl.float32)
    output_pointers = output_ptr + token * stride_output_token + head * stride_output_head + columns
    if QUANTIZE:
        # The row rms_norm would return (input dtype == weight dtype here), then its codes.
        output = (normalized * weight).to(input_dtype).to(tl.float32)
        store_quantized_row(output_pointers, scale_ptr + row, output, is_column, QMAX, IS_INT)
    else:
        tl.store(
            output_pointers, (normalized * weight).to(output_ptr.dtype.element_ty), mask=is_column
        )


def _as_heads(x: torch.Tensor) -> torch.Tensor:
    """A [tokens, heads, hidden] view of x with a unit stride on the last dim (copy only if not)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 3:
        return x
    if x.dim() == 2:
        return x.unsqueeze(1)
    return x.reshape(-1, 1, x.shape[-1])


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """weight * normalise(x [+ residual]) over the last dim; a new tensor shaped like x.

    With residual ([num_tokens, hidden], contiguous rows), the sum x + residual is also written
    back into residual in place, so the caller's residual tensor becomes the new residual stream.
    """
    hidden = x.shape[-1]
    output_dtype = torch.promote_types(x.dtype, weight.dtype)
    output = torch.empty(x.shape, dtype=output_dtype, device=x.device)
    if x.numel() == 0:
        return output
    rows = _as_heads(x)
    output_rows = _as_heads(output)
    num_tokens, num_heads, _ = rows.shape
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype and num_heads == 1
        assert residual.stride(-1) == 1, "residual rows must be contiguous"
        residual_rows = residual.reshape(num_tokens, hidden)
        stride_residual = residual_rows.stride(0)
    else:
        residual_rows = x  # unused
        stride_residual = 0
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(num_tokens * num_heads,)](
        output_rows,
        output_rows,  # no scales
        rows,
        residual_rows,
        weight,
        num_heads,
        rows.stride(0),
        rows.stride(1),
        output_rows.stride(0),
        output_rows.stride(1),
        stride_residual,
        eps,
        HIDDEN=hidden,
        BLOCK=block,
        HAS_RESIDUAL=residual is not None,
        QUANTIZE=False,
        QMAX=0.0,
        IS_INT=False,
        num_warps=_num_warps(block),
        **pdl_launch(x.device, num_tokens),
    )
    return output


def _num_warps(block: int) -> int:
    return min(16, max(1, block // 256))


def rms_norm_quant(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    code_dtype: torch.dtype,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_quant(rms_norm(x, weight, eps, residual), code_dtype) in one launch: (codes
    [M, K] of code_dtype, float32 scales [M, 1]), bit for bit. x [M, K] with contiguous rows and
    weight share a dtype; with residual the sum is written back into it as rms_norm does."""
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"rms_norm_quant needs a row-contiguous [M, K] matrix, got {x.shape}")
    if weight.dtype != x.dtype or weight.shape != x.shape[1:]:
        raise ValueError(
            f"rms_norm_quant needs a weight of shape {tuple(x.shape[1:])} and dtype {x.dtype}, "
            f"got {tuple(weight.shape)} {weight.dtype}"
        )
    qmax = quant_max(code_dtype)
    num_tokens, hidden = x.shape
    codes = torch.empty(num_tokens, hidden, dtype=code_dtype, device=x.device)
    scale = torch.empty(num_tokens, 1, dtype=torch.float32, device=x.device)
    if num_tokens == 0:
        return codes, scale
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype or not residual.is_contiguous():
            raise ValueError(
                f"rms_norm_quant's residual must be a contiguous {tuple(x.shape)} {x.dtype} "
                f"tensor, got {tuple(residual.shape)} {residual.dtype}"
            )
        residual_rows, stride_residual = residual, residual.stride(0)
    else:
        residual_rows, stride_residual = x, 0  # unused
    block = triton.next_power_of_2(hidden)
    _rms_norm_kernel[(num_tokens,)](
        codes,
        scale,
        x,
        residual_rows,
        weight,
        1,
        x.stride(0),
        0,
        codes.stride(0),
        0,
        stride_residual,
        eps,
        HIDDEN=hidden,
        BLOCK=block,
        HAS_RESIDUAL=residual is not None,
        QUANTIZE=True,
        QMAX=qmax,
        IS_INT=code_dtype == torch.int8,
        # The norm's own warps: the variance then sums in rms_norm's order, the same bits.
        num_warps=_num_warps(block),
        **pdl_launch(x.device, num_tokens),
    )
    return codes, scale
