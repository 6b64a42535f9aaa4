"""The attention backend interface: write this step's keys/values into the paged cache, then
attend each query token over its request's cached context. Every backend imports this module;
`attention/backend.py` picks one."""

from __future__ import annotations

from typing import Protocol

import torch

from ladle.attention.kv_quant import FP8_KV_DTYPE, quantize_kv
from ladle.attention.metadata import AttentionMetadata

# (k_scale, v_scale): one layer's float8 KV cache scales, float32 tensors of one element.
KVScales = tuple[torch.Tensor, torch.Tensor]


class AttentionBackend(Protocol):
    """kv_cache is one layer's cache: [2, num_blocks, block_size, num_kv_heads, head_dim], in the
    model's dtype, or float8 e4m3 with kv_scales given (attention/kv_quant.py)."""

    name: str

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,
        cache_written: bool = False,  # the keys and values are in kv_cache already: only attend
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...


def write_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_scales: KVScales | None = None,
) -> None:
    """Scatter this step's keys and values into their cache slots (shared by every backend);
    into a float8 cache quantized with kv_scales."""
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    if kv_cache.dtype == FP8_KV_DTYPE:
        if kv_scales is None:
            raise ValueError("a float8 KV cache needs its layer's (k_scale, v_scale)")
        # index_copy_ has no float8 kernel on the CPU: copy the codes as bytes.
        key = quantize_kv(key, kv_scales[0]).view(torch.uint8)
        value = quantize_kv(value, kv_scales[1]).view(torch.uint8)
        kv_cache = kv_cache.view(torch.uint8)
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)
