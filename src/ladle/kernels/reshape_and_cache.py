"""Write this step's keys and values into their paged-cache slots in one launch.

The torch reference is ladle.attention.backend.write_kv_cache (two index_copy_ calls). One program
copies one token's K and V rows (all kv heads); a negative slot means "do not write". Into a
float8 cache it divides by the layer's k/v scale and saturates to e4m3's range on the way
(QUANTIZE; reference: ladle.attention.kv_quant.quantize_kv).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def cache_codes(x, scale_ptr, cache_dtype: tl.constexpr, QUANTIZE: tl.constexpr):
    """x as the cache stores it: into a float8 cache divided by the layer's scale and saturated
    to e4m3's range (shared with the rotary kernel's cache write, kernels/rotary.py)."""
    if QUANTIZE:
        # IEEE division, as the torch reference divides: the codes then match it exactly.
        x = tl.clamp(tl.math.div_rn(x.to(tl.float32), tl.load(scale_ptr)), -448.0, 448.0)
    return x.to(cache_dtype)


# slot_mapping is a view into the step's inputs (and stands in for the scales of a cache that is
# not float8): its alignment varies from step to step.
@triton.jit(do_not_specialize_on_alignment=["slot_mapping_ptr", "k_scale_ptr", "v_scale_ptr"])
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    k_scale_ptr,  # [1] float32, read when QUANTIZE
    v_scale_ptr,
    stride_key_token,
    stride_key_head,
    stride_value_token,
    stride_value_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
    QUANTIZE: tl.constexpr = False,
):
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:
        return
    elements = tl.arange(0, BLOCK)
    is_valid = elements < NUM_KV_HEADS * HEAD_DIM
    head = elements // HEAD_DIM
    dim = elements % HEAD_DIM
    token_row = token.to(tl.int64)
    key = tl.load(
        key_ptr + token_row * stride_key_token + head * stride_key_head + dim, mask=is_valid
    )
    value = tl.load(
        value_ptr + token_row * stride_value_token + head * stride_value_head + dim, mask=is_valid
    )
    # The cache is contiguous, so a slot (block_id * block_size + offset) is a flat token row.
    cache_offsets = slot * (NUM_KV_HEADS * HEAD_DIM) + elements
    key = cache_codes(key, k_scale_ptr, key_cache_ptr.dtype.element_ty, QUANTIZE)
    value = cache_codes(value, v_scale_ptr, value_cache_ptr.dtype.element_ty, QUANTIZE)
    tl.store(key_cache_ptr + cache_offsets, key, mask=is_valid)
    tl.store(value_cache_ptr + cache_offsets, value, mask=is_valid)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """key, value [num_tokens, num_kv_heads, head_dim] (head_dim contiguous) -> kv_cache slots;
    a float8 e4m3 cache needs k_scale and v_scale (float32, one element each)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    quantize = kv_cache.dtype == torch.float8_e4m3fn
    if quantize and (k_scale is None or v_scale is None):
        raise ValueError("a float8 KV cache needs k_scale and v_scale")
    assert kv_cache.is_contiguous(), "kv_cache must be contiguous"
    assert kv_cache.shape[3] == num_kv_heads and kv_cache.shape[4] == head_dim
    assert key.stride(2) == 1 and value.stride(2) == 1, "head_dim must be contiguous"
    if num_tokens == 0:
        return
    block = triton.next_power_of_2(num_kv_heads * head_dim)
    _reshape_and_cache_kernel[(num_tokens,)](
        key,
        value,
        kv_cache[0],
        kv_cache[1],
        slot_mapping,
        k_scale if quantize else slot_mapping,  # unused unless QUANTIZE
        v_scale if quantize else slot_mapping,
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK=block,
        QUANTIZE=quantize,
        num_warps=4 if block >= 1024 else 1,
    )
