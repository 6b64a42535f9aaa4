"""The attention layer: reshapes projected q/k/v into heads and hands them, with this layer's
slice of the paged KV cache and the step's metadata, to the attention backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ladle.attention.base import AttentionBackend, KVScales
from ladle.attention.kv_quant import is_fp8_kv_cache
from ladle.attention.metadata import AttentionMetadata
from ladle.model.layers.rotary import RotaryEmbedding

if TYPE_CHECKING:
    from ladle.kernels.rotary import QKNorm


class Attention(nn.Module):
    """Paged attention for one decoder layer. Holds no weights and no cache: the cache tensor and
    the metadata are passed in each call, so the same module serves any batch.

    k_scale and v_scale (float32, one number each) are this layer's float8 KV cache scales, used
    only when the cache passed in is float8 (attention/kv_quant.py): 1.0 until a checkpoint's
    `k_scale`/`v_scale` or the start-up calibration (worker/kv_calibration.py) sets them."""

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        backend: AttentionBackend,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.backend = backend
        self.register_buffer("k_scale", torch.ones(1, dtype=torch.float32), persistent=False)
        self.register_buffer("v_scale", torch.ones(1, dtype=torch.float32), persistent=False)
        self.kv_scales_source = "default"  # "checkpoint" or "calibration" once set

    def init_buffers(self) -> None:
        """After the meta-device build: the scales in float32 (materialising gave them the
        model's dtype), at 1.0."""
        device = self.k_scale.device
        self.k_scale = torch.ones(1, dtype=torch.float32, device=device)
        self.v_scale = torch.ones(1, dtype=torch.float32, device=device)

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] or flat
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        metadata: AttentionMetadata,
        cache_written: bool = False,
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
        """cache_written: the step's keys and values are already in kv_cache
        (`rotate_and_cache_`), so the backend only attends."""
        num_tokens = query.shape[0]
        value = value.view(num_tokens, self.num_kv_heads, self.head_dim)
        output = self.backend.forward(
            query,
            key,
            value,
            kv_cache,
            metadata,
            self.scale,
            self._kv_scales(kv_cache),
            cache_written=cache_written,
        )
        return output.reshape(num_tokens, self.num_heads * self.head_dim)

    def rotate_and_cache_(
        self,
        rotary: RotaryEmbedding,
        positions: torch.Tensor,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim] or flat
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        qk_norm: QKNorm | None = None,
    ) -> bool:
        """Rotate query and key in place and write this step's keys and values into kv_cache in
        one launch where the rotary's fused kernel applies (CUDA), normalising the heads first
        given qk_norm; False, with nothing done, elsewhere. Called before forward(...,
        cache_written=True), so hooks on forward still see the rotated keys
        (worker/kv_calibration.py reads them)."""
        value = value.view(query.shape[0], self.num_kv_heads, self.head_dim)
        return rotary.rotate_and_cache_(
            positions,
            query,
            key,
            value,
            kv_cache,
            metadata.slot_mapping,
            self._kv_scales(kv_cache),
            qk_norm,
        )

    def _kv_scales(self, kv_cache: torch.Tensor) -> KVScales | None:
        return (self.k_scale, self.v_scale) if is_fp8_kv_cache(kv_cache) else None

    def can_attend_cached(self, kv_cache: torch.Tensor) -> bool:
        """Whether `attend_cached` may be called: a backend that attends over the cache alone
        (the CPU's) and a cache without float8 scales."""
        return hasattr(self.backend, "attend") and not is_fp8_kv_cache(kv_cache)

    def attend_cached(
        self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:  # [num_tokens, num_heads * head_dim]
        """Attention for a step whose keys and values are already in the cache (written by the
        caller, kernels/cpu_native/rotary_cache.c)."""
        output = self.backend.attend(query, kv_cache, metadata, self.scale)
        return output.reshape(query.shape[0], self.num_heads * self.head_dim)

    def extra_repr(self) -> str:
        return (
            f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"backend={getattr(self.backend, 'name', type(self.backend).__name__)}"
        )
