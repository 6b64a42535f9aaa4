"""Neox-style rotary embedding of query and key, in place, in one launch.

One program per token: it reads the token's cos/sin row from the [max_positions, head_dim] table
(cos in the first half, sin in the second) once and rotates every query and key head of that
token. q and k may be strided views of the merged qkv output (only head_dim must be contiguous).

Given the layer's paged cache, the same program also writes the token's rotated keys and its
values into their cache slot, as kernels/reshape_and_cache.py would (the same codes, float8 too):
one launch a layer fewer, which at batch 1 is ~2 us of an H100 decode step per layer.

Given Qwen3's per-head q/k norm weights (`qk_norm`), the program first normalises each head as
kernels/rms_norm.py would (the same roundings; only the variance's summation order differs), so
the two norm launches of a layer go too: at batch 1 on the Qwen3-0.6B shape, 56 of a decode
step's ~340 launches.

Same rounding as the torch layer (model/layers/rotary.py, as HF computes it in the model dtype):
each product and each sum is rounded to the tensor's dtype, so bf16 results are bit-identical.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ladle.kernels.pdl import enter_dependent_launch, pdl_launch
from ladle.kernels.reshape_and_cache import cache_codes


class QKNorm(NamedTuple):
    """Per-head RMSNorm weights for the query and key heads (Qwen3) and the norms' epsilon."""

    query_weight: torch.Tensor
    key_weight: torch.Tensor
    eps: float


@triton.jit
def _rotate_heads(
    pointer,
    token,
    stride_token,
    stride_head,
    num_heads,
    cos,
    sin,
    norm_weight_ptr,
    eps,
    HALF: tl.constexpr,
    HEADS_PADDED: tl.constexpr,
    HALF_PADDED: tl.constexpr,
    NORM: tl.constexpr,
):
    dtype = pointer.dtype.element_ty
    heads = tl.arange(0, HEADS_PADDED)
    dims = tl.arange(0, HALF_PADDED)
    mask = (heads[:, None] < num_heads) & (dims[None, :] < HALF)
    first = pointer + token * stride_token + heads[:, None] * stride_head + dims[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        # RMSNorm over each head (both halves), rounded as kernels/rms_norm.py rounds: the
        # normalised head to the dtype, then its product with the weight.
        variance = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF)
        inverse = tl.rsqrt(variance + eps)[:, None]
        is_dim = dims < HALF
        weight1 = tl.load(norm_weight_ptr + dims, mask=is_dim, other=0.0).to(tl.float32)
        weight2 = tl.load(norm_weight_ptr + HALF + dims, mask=is_dim, other=0.0).to(tl.float32)
        x1 = ((x1 * inverse).to(dtype).to(tl.float32) * weight1[None, :]).to(dtype).to(tl.float32)
        x2 = ((x2 * inverse).to(dtype).to(tl.float32) * weight2[None, :]).to(dtype).to(tl.float32)
    # Round each product and sum to the dtype, as the eager bf16 ops do.
    x1_cos = (x1 * cos).to(dtype).to(tl.float32)
    x2_sin = (x2 * sin).to(dtype).to(tl.float32)
    x2_cos = (x2 * cos).to(dtype).to(tl.float32)
    x1_sin = (x1 * sin).to(dtype).to(tl.float32)
    out1 = (x1_cos - x2_sin).to(dtype)
    out2 = (x2_cos + x1_sin).to(dtype)
    tl.store(first, out1, mask=mask)
    tl.store(first + HALF, out2, mask=mask)
    return out1, out2


@triton.jit
def _write_heads_to_cache(
    cache_ptr,
    slot,
    first_half,
    second_half,
    scale_ptr,
    num_heads,
    HALF: tl.constexpr,
    HEADS_PADDED: tl.constexpr,
    HALF_PADDED: tl.constexpr,
    QUANTIZE: tl.constexpr,
):
    """One token's heads [HEADS_PADDED, HALF_PADDED] x 2 halves into cache slot `slot` (the cache
    is contiguous: a slot is a flat row of num_heads * 2 * HALF elements); no write if slot < 0."""
    heads = tl.arange(0, HEADS_PADDED)
    dims = tl.arange(0, HALF_PADDED)
    mask = (heads[:, None] < num_heads) & (dims[None, :] < HALF) & (slot >= 0)
    row = cache_ptr + slot * (num_heads * 2 * HALF) + heads[:, None] * (2 * HALF) + dims[None, :]
    cache_dtype = cache_ptr.dtype.element_ty
    tl.store(row, cache_codes(first_half, scale_ptr, cache_dtype, QUANTIZE), mask=mask)
    tl.store(row + HALF, cache_codes(second_half, scale_ptr, cache_dtype, QUANTIZE), mask=mask)


# Views into the step's inputs (and stand-ins for the cache pointers when there is no cache write):
# their alignment varies from step to step.
@triton.jit(
    do_not_specialize_on_alignment=[
        "positions_ptr",
        "value_ptr",
        "slot_mapping_ptr",
        "k_scale_ptr",
        "v_scale_ptr",
    ]
)
def _rotary_kernel(
    query_ptr,
    key_ptr,
    cos_sin_ptr,
    positions_ptr,
    value_ptr,  # the rest only read when WRITE_CACHE
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    k_scale_ptr,  # [1] float32, read when QUANTIZE
    v_scale_ptr,
    query_norm_ptr,  # [head_dim] each, read when NORM
    key_norm_ptr,
    eps,
    num_query_heads,
    num_key_heads,
    stride_query_token,
    stride_query_head,
    stride_key_token,
    stride_key_head,
    stride_value_token,
    stride_value_head,
    stride_cos_sin,
    HALF: tl.constexpr,
    HALF_PADDED: tl.constexpr,
    QUERY_HEADS_PADDED: tl.constexpr,
    KEY_HEADS_PADDED: tl.constexpr,
    WRITE_CACHE: tl.constexpr = False,
    QUANTIZE: tl.constexpr = False,
    NORM: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
):
    enter_dependent_launch(USE_PDL)  # kernels/pdl.py
    token = tl.program_id(0).to(tl.int64)
    position = tl.load(positions_ptr + token).to(tl.int64)
    dims = tl.arange(0, HALF_PADDED)
    is_dim = dims < HALF
    table_row = cos_sin_ptr + position * stride_cos_sin
    cos = tl.load(table_row + dims, mask=is_dim, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(table_row + HALF + dims, mask=is_dim, other=0.0).to(tl.float32)[None, :]
    _rotate_heads(  # the query's rotated halves stay in place only
        query_ptr,
        token,
        stride_query_token,
        stride_query_head,
        num_query_heads,
        cos,
        sin,
        query_norm_ptr,
        eps,
        HALF,
        QUERY_HEADS_PADDED,
        HALF_PADDED,
        NORM,
    )
    key1, key2 = _rotate_heads(
        key_ptr,
        token,
        stride_key_token,
        stride_key_head,
        num_key_heads,
        cos,
        sin,
        key_norm_ptr,
        eps,
        HALF,
        KEY_HEADS_PADDED,
        HALF_PADDED,
        NORM,
    )
    if WRITE_CACHE:
        slot = tl.load(slot_mapping_ptr + token).to(tl.int64)  # < 0: padding, no write
        _write_heads_to_cache(
            key_cache_ptr,
            slot,
            key1,
            key2,
            k_scale_ptr,
            num_key_heads,
            HALF,
            KEY_HEADS_PADDED,
            HALF_PADDED,
            QUANTIZE,
        )
        heads = tl.arange(0, KEY_HEADS_PADDED)
        mask = (heads[:, None] < num_key_heads) & is_dim[None, :]
        values = value_ptr + token * stride_value_token + heads[:, None] * stride_value_head
        _write_heads_to_cache(
            value_cache_ptr,
            slot,
            tl.load(values + dims[None, :], mask=mask, other=0.0),
            tl.load(values + HALF + dims[None, :], mask=mask, other=0.0),
            v_scale_ptr,
            num_key_heads,
            HALF,
            KEY_HEADS_PADDED,
            HALF_PADDED,
            QUANTIZE,
        )


def rotary_embedding_(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    value: torch.Tensor | None = None,
    kv_cache: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    qk_norm: QKNorm | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate query [num_tokens, num_heads, head_dim] and key [num_tokens, num_kv_heads, head_dim]
    in place at positions [num_tokens]; returns (query, key). Needs query, key and the table in
    one dtype and unit stride on head_dim.

    Given qk_norm, each query and key head is RMS-normalised with its weight ([head_dim], the
    tensors' dtype) first, in the same launch (Qwen3's q_norm and k_norm).

    Given kv_cache (the layer's contiguous [2, num_blocks, block_size, num_kv_heads, head_dim]),
    the rotated keys and value (shaped like key) also go into the cache at slot_mapping
    [num_tokens] (< 0: no write), as reshape_and_cache writes them; a float8 cache needs
    kv_scales, its (k_scale, v_scale) as float32 tensors of one element."""
    num_tokens, num_query_heads, head_dim = query.shape
    num_key_heads = key.shape[1]
    assert query.stride(2) == 1 and key.stride(2) == 1, "head_dim must be contiguous"
    assert cos_sin_cache.stride(1) == 1 and head_dim % 2 == 0
    if num_tokens == 0:
        return query, key
    half = head_dim // 2
    write_cache = kv_cache is not None
    quantize = write_cache and kv_cache.dtype == torch.float8_e4m3fn
    if write_cache:
        assert value is not None and slot_mapping is not None
        assert value.shape == key.shape and value.stride(2) == 1, "value must be shaped like key"
        assert kv_cache.is_contiguous(), "kv_cache must be contiguous"
        assert kv_cache.shape[3] == num_key_heads and kv_cache.shape[4] == head_dim
        if quantize and kv_scales is None:
            raise ValueError("a float8 KV cache needs k_scale and v_scale")
        key_cache, value_cache = kv_cache[0], kv_cache[1]
    else:
        # Never read (WRITE_CACHE is off): key and positions stand in for the cache's arguments.
        value = key_cache = value_cache = key
        slot_mapping = positions
    k_scale, v_scale = kv_scales if quantize else (positions, positions)
    if qk_norm is not None:
        for weight in (qk_norm.query_weight, qk_norm.key_weight):
            assert weight.shape == (head_dim,) and weight.dtype == query.dtype
        query_norm, key_norm, eps = qk_norm.query_weight, qk_norm.key_weight, qk_norm.eps
    else:
        query_norm, key_norm, eps = positions, positions, 0.0  # never read
    _rotary_kernel[(num_tokens,)](
        query,
        key,
        cos_sin_cache,
        positions,
        value,
        key_cache,
        value_cache,
        slot_mapping,
        k_scale,
        v_scale,
        query_norm,
        key_norm,
        eps,
        num_query_heads,
        num_key_heads,
        query.stride(0),
        query.stride(1),
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        cos_sin_cache.stride(0),
        HALF=half,
        HALF_PADDED=triton.next_power_of_2(half),
        QUERY_HEADS_PADDED=triton.next_power_of_2(num_query_heads),
        KEY_HEADS_PADDED=triton.next_power_of_2(num_key_heads),
        WRITE_CACHE=write_cache,
        QUANTIZE=quantize,
        NORM=qk_norm is not None,
        num_warps=4,
        **pdl_launch(query.device, num_tokens),
        # No mul+add contraction into FMAs: float32 results then round as the eager ops do.
        enable_fp_fusion=False,
    )
    return query, key
