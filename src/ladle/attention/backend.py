"""The attention backend interface: write this step's keys/values into the paged cache, then
attend each query token over its request's cached context."""

from __future__ import annotations

from typing import Protocol

import torch

from ladle.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    """kv_cache is one layer's cache: [2, num_blocks, block_size, num_kv_heads, head_dim]."""

    name: str

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        ...


def write_kv_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter this step's keys and values into their cache slots (shared by every backend)."""
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    kv_cache[0].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    kv_cache[1].view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def get_attention_backend(device: torch.device, name: str = "auto") -> AttentionBackend:
    """'auto': the Triton kernels on CUDA, the batched CPU backend elsewhere."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "cpu"
    if name == "cpu":
        from ladle.attention.cpu_backend import CpuAttentionBackend

        return CpuAttentionBackend()
    if name == "torch":
        from ladle.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        from ladle.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; choose auto, cpu, torch or triton")
