"""RMSNorm in one launch, optionally fused with the residual add; also Qwen3's per-head q/k norm.

Same rounding as the torch layer (model/layers/norm.py, which follows HF): the residual sum is
rounded to the input dtype before it is normalised, the normalised row is rounded to the input
dtype before the weight multiply, and the product is rounded to the output dtype. Only the
variance's summation order differs from torch's.

One program per row. Rows are addressed as (token, head) with two strides, so a strided
[num_tokens, num_heads, head_dim] view of the merged qkv output is normalised per head without a
copy; a plain [num_tokens, hidden] tensor is the case num_heads = 1. The torch reference is
RMSNorm's own torch path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    output_ptr,
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
):
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
    output_dtype = output_ptr.dtype.element_ty
    tl.store(
        output_ptr + token * stride_output_token + head * stride_output_head + columns,
        (normalized * weight).to(output_dtype),
        mask=is_column,
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
        num_warps=min(16, max(1, block // 256)),
    )
    return output
