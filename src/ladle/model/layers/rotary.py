"""Rotary position embedding, neox style (rotate halves), as in HF Llama / Qwen / Mistral.

The cos and sin tables are precomputed for every position up to max_position_embeddings and
indexed by each token's position, so a flattened batch of any mix of requests needs one gather.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from ladle.kernels.dispatch import use_fused_kernels

if TYPE_CHECKING:
    from ladle.kernels.rotary import QKNorm
    from ladle.model.layers.norm import RMSNorm


def compute_inv_freq(head_dim: int, base: float, rope_scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] in float32, with 'llama3' scaling applied when given.

    The llama3 rule (Llama 3.1): frequencies whose wavelength is shorter than the original
    context / high_freq_factor are kept, those longer than original context / low_freq_factor are
    divided by factor, and the band between is interpolated smoothly.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (base**exponents)
    if rope_scaling is None:
        return inv_freq
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type"))
    if rope_type != "llama3":
        raise ValueError(f"rope scaling type {rope_type!r} is not supported")
    factor = float(rope_scaling["factor"])
    low_freq_factor = float(rope_scaling["low_freq_factor"])
    high_freq_factor = float(rope_scaling["high_freq_factor"])
    old_context_len = float(rope_scaling["original_max_position_embeddings"])
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Applies rotary embeddings to query and key heads at given positions.

    The cos/sin cache is a non-persistent buffer: it is never in a checkpoint, and after a model
    built on the meta device is materialised the loader calls init_buffers() to fill it.
    """

    def __init__(
        self,
        head_dim: int,
        max_position_embeddings: int,
        base: float,
        rope_scaling: dict | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.max_position_embeddings = max_position_embeddings
        self.base = base
        self.rope_scaling = rope_scaling
        # [max_positions, head_dim]: cos in the first half of the last dim, sin in the second.
        self.register_buffer(
            "cos_sin_cache", torch.empty(max_position_embeddings, head_dim), persistent=False
        )
        if self.cos_sin_cache.device.type != "meta":
            self.init_buffers()

    @torch.no_grad()
    def init_buffers(self) -> None:
        """(Re)compute the cos/sin table in float32 on the buffer's device, then store it in the
        buffer's dtype: the same rounding HF applies when it casts cos/sin to the model dtype."""
        device = self.cos_sin_cache.device
        inv_freq = compute_inv_freq(self.head_dim, self.base, self.rope_scaling).to(device)
        positions = torch.arange(self.max_position_embeddings, dtype=torch.float32, device=device)
        freqs = torch.outer(positions, inv_freq)
        self.cos_sin_cache.copy_(torch.cat((freqs.cos(), freqs.sin()), dim=-1))

    def forward(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        qk_norm: QKNorm | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """query [num_tokens, num_heads, head_dim], key [num_tokens, num_kv_heads, head_dim].

        On CUDA both are rotated in place by one Triton launch (kernels/rotary.py) and returned;
        elsewhere new tensors are returned and the inputs are left alone. qk_norm (only where
        `may_norm_heads` said yes): the launch normalises each head first.
        """
        if use_fused_kernels(query) and self._may_fuse(query, key):
            # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
            # triton; tests/model/test_fused_kernel_dispatch.py).
            from ladle.kernels.rotary import rotary_embedding_

            return rotary_embedding_(positions, query, key, self.cos_sin_cache, qk_norm=qk_norm)
        assert qk_norm is None, "the heads' norm is fused only into the CUDA rotary kernel"
        cos, sin = self.cos_sin_cache[positions].unsqueeze(1).chunk(2, dim=-1)
        return _rotate(query, cos, sin), _rotate(key, cos, sin)

    def rotate_and_cache_(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
        kv_scales: tuple[torch.Tensor, torch.Tensor] | None,
        qk_norm: QKNorm | None = None,
    ) -> bool:
        """On CUDA, rotate query and key in place and write the step's keys and values into the
        paged cache in the same launch (kernels/rotary.py), normalising the heads first given
        qk_norm; returns False, having done nothing, where that kernel does not apply (the caller
        then rotates and the backend writes)."""
        if not (
            use_fused_kernels(query)
            and self._may_fuse(query, key)
            and value.stride(-1) == 1
            and kv_cache.is_contiguous()
        ):
            return False
        # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
        # triton; tests/model/test_fused_kernel_dispatch.py).
        from ladle.kernels.rotary import rotary_embedding_

        rotary_embedding_(
            positions,
            query,
            key,
            self.cos_sin_cache,
            value,
            kv_cache,
            slot_mapping,
            kv_scales,
            qk_norm,
        )
        return True

    def may_norm_heads(
        self, query: torch.Tensor, key: torch.Tensor, query_norm: RMSNorm, key_norm: RMSNorm
    ) -> QKNorm | None:
        """Qwen3's per-head q/k norms as the rotary kernel takes them, to run in its launch
        (two launches a layer fewer), where that kernel rotates these heads and the norms'
        weights share their dtype; else None (the caller runs the norms)."""
        if not (use_fused_kernels(query) and self._may_fuse(query, key)):
            return None
        if not query_norm.weight.dtype == key_norm.weight.dtype == query.dtype:
            return None
        if query_norm.eps != key_norm.eps:
            return None
        from ladle.kernels.rotary import QKNorm  # as above: CUDA only

        return QKNorm(query_norm.weight, key_norm.weight, query_norm.eps)

    def step_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin), each [num_tokens, 1, head_dim], for `rotate_with_tables`: built
        once per step and shared by every layer (the positions are the same in all of them).
        cos repeats the halves' cosines; sin is (-sin, sin), so the rotation is two multiplies
        and an add per element, with the same rounding as _rotate."""
        cos, sin = self.cos_sin_cache.index_select(0, positions).unsqueeze(1).chunk(2, dim=-1)
        return torch.cat((cos, cos), dim=-1), torch.cat((-sin, sin), dim=-1)

    def _may_fuse(self, query: torch.Tensor, key: torch.Tensor) -> bool:
        return (
            query.dtype == key.dtype == self.cos_sin_cache.dtype
            and query.stride(-1) == 1
            and key.stride(-1) == 1
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, max_positions={self.max_position_embeddings}, "
            f"base={self.base}, scaling={self.rope_scaling}"
        )


def rotate_with_tables(x: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Rotary applied to x [num_tokens, heads, head_dim] with `step_tables`: four ops for
    query and key heads together (vs ~20 for _rotate on each), the same values bit for bit:
    first half x1 * cos + x2 * -sin, second half x2 * cos + x1 * sin."""
    cos, signed_sin = tables
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((x2, x1), dim=-1) * signed_sin


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # Neox layout: the pairs rotated together are (i, i + head_dim / 2), not adjacent elements.
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
