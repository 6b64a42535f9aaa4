"""Write this step's keys and values into their paged-cache slots in one launch.

The torch reference is ladle.attention.backend.write_kv_cache (two index_copy_ calls). One program
copies one token's K and V rows (all kv heads); a negative slot means "do not write".
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize_on_alignment=["slot_mapping_ptr"])  # a view into the step's inputs
def _reshape_and_cache_kernel(
    key_ptr,
    value_ptr,
    key_cache_ptr,
    value_cache_ptr,
    slot_mapping_ptr,
    stride_key_token,
    stride_key_head,
    stride_value_token,
    stride_value_head,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK: tl.constexpr,
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
    tl.store(key_cache_ptr + cache_offsets, key.to(key_cache_ptr.dtype.element_ty), mask=is_valid)
    tl.store(
        value_cache_ptr + cache_offsets, value.to(value_cache_ptr.dtype.element_ty), mask=is_valid
    )


def reshape_and_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """key, value [num_tokens, num_kv_heads, head_dim] (head_dim contiguous) -> kv_cache slots."""
    num_tokens, num_kv_heads, head_dim = key.shape
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
        key.stride(0),
        key.stride(1),
        value.stride(0),
        value.stride(1),
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK=block,
        num_warps=4 if block >= 1024 else 1,
    )
