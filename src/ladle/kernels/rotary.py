"""Neox-style rotary embedding of query and key, in place, in one launch.

One program per token: it reads the token's cos/sin row from the [max_positions, head_dim] table
(cos in the first half, sin in the second) once and rotates every query and key head of that
token. q and k may be strided views of the merged qkv output (only head_dim must be contiguous).

Same rounding as the torch layer (model/layers/rotary.py, as HF computes it in the model dtype):
each product and each sum is rounded to the tensor's dtype, so bf16 results are bit-identical.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    pointer,
    token,
    stride_token,
    stride_head,
    num_heads,
    cos,
    sin,
    HALF: tl.constexpr,
    HEADS_PADDED: tl.constexpr,
    HALF_PADDED: tl.constexpr,
):
    dtype = pointer.dtype.element_ty
    heads = tl.arange(0, HEADS_PADDED)
    dims = tl.arange(0, HALF_PADDED)
    mask = (heads[:, None] < num_heads) & (dims[None, :] < HALF)
    first = pointer + token * stride_token + heads[:, None] * stride_head + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    # Round each product and sum to the dtype, as the eager bf16 ops do.
    x1_cos = (x1 * cos).to(dtype).to(tl.float32)
    x2_sin = (x2 * sin).to(dtype).to(tl.float32)
    x2_cos = (x2 * cos).to(dtype).to(tl.float32)
    x1_sin = (x1 * sin).to(dtype).to(tl.float32)
    tl.store(first, (x1_cos - x2_sin).to(dtype), mask=mask)
    tl.store(first + HALF, (x2_cos + x1_sin).to(dtype), mask=mask)


@triton.jit(do_not_specialize_on_alignment=["positions_ptr"])  # a view into the step's inputs
def _rotary_kernel(
    query_ptr,
    key_ptr,
    cos_sin_ptr,
    positions_ptr,
    num_query_heads,
    num_key_heads,
    stride_query_token,
    stride_query_head,
    stride_key_token,
    stride_key_head,
    stride_cos_sin,
    HALF: tl.constexpr,
    HALF_PADDED: tl.constexpr,
    QUERY_HEADS_PADDED: tl.constexpr,
    KEY_HEADS_PADDED: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, HALF_PADDED)
    is_dim = dims < HALF
    table_row = cos_sin_ptr + position * stride_cos_sin
    cos = tl.load(table_row + dims, mask=is_dim, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(table_row + HALF + dims, mask=is_dim, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(
        query_ptr,
        token,
        stride_query_token,
        stride_query_head,
        num_query_heads,
        cos,
        sin,
        HALF,
        QUERY_HEADS_PADDED,
        HALF_PADDED,
    )
    _rotate_heads(
        key_ptr,
        token,
        stride_key_token,
        stride_key_head,
        num_key_heads,
        cos,
        sin,
        HALF,
        KEY_HEADS_PADDED,
        HALF_PADDED,
    )


def rotary_embedding_(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate query [num_tokens, num_heads, head_dim] and key [num_tokens, num_kv_heads, head_dim]
    in place at positions [num_tokens]; returns (query, key). Needs query, key and the table in
    one dtype and unit stride on head_dim."""
    num_tokens, num_query_heads, head_dim = query.shape
    num_key_heads = key.shape[1]
    assert query.stride(2) == 1 and key.stride(2) == 1, "head_dim must be contiguous"
    assert cos_sin_cache.stride(1) == 1 and head_dim % 2 == 0
    if num_tokens == 0:
        return query, key
    half = head_dim // 2
    _rotary_kernel[(num_tokens,)](
        query,
        key,
        cos_sin_cache,
        positions,
        num_query_heads,
        num_key_heads,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        cos_sin_cache.stride(0),
        HALF=half,
        HALF_PADDED=triton.next_power_of_2(half),
        QUERY_HEADS_PADDED=triton.next_power_of_2(num_query_heads),
        KEY_HEADS_PADDED=triton.next_power_of_2(num_key_heads),
        num_warps=4,
        # No mul+add contraction into FMAs: float32 results then round as the eager ops do.
        enable_fp_fusion=False,
    )
    return query, key
