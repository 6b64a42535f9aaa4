"""Pick the attention backend for a device (the interface is in attention/base.py)."""

from __future__ import annotations

import torch

from ladle.attention.base import AttentionBackend
from ladle.attention.cpu_backend import CpuAttentionBackend
from ladle.attention.torch_backend import TorchAttentionBackend


def get_attention_backend(device: torch.device, name: str = "auto") -> AttentionBackend:
    """'auto': the Triton kernels on CUDA, the batched CPU backend elsewhere."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "cpu"
    if name == "cpu":
        return CpuAttentionBackend()
    if name == "torch":
        return TorchAttentionBackend()
    if name == "triton":
        # Imported on demand: it needs triton, which a CPU-only install lacks.
        from ladle.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; choose auto, cpu, torch or triton")
