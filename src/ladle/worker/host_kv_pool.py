"""The host tier's memory: one block-major allocation, [host blocks, layers, 2, block_size, kv
heads, head dim], so a host block's KV for every layer is one contiguous span (one DMA).

Pinned on CUDA, so device <-> host copies are asynchronous DMA that overlaps compute; on the CPU
a plain (lazily zeroed) tensor, a second pool beside the device pool (core/host_tier.py keeps
the bookkeeping, worker/kv_copier.py the copies).
"""

from __future__ import annotations

import torch

from ladle.worker.kv_cache_alloc import zeros_lazily


def allocate_host_kv_pool(
    num_layers: int,
    num_blocks: int,
    block_shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """The [num_blocks, num_layers, 2, *block_shape] host pool in the KV cache's dtype (fp8
    stays fp8: the copies move bytes); pinned when the device is CUDA."""
    if num_blocks < 1:
        raise ValueError(f"the host KV pool needs num_blocks >= 1, got {num_blocks}")
    shape = (num_blocks, num_layers, 2, *block_shape)
    if device.type == "cuda":
        return torch.empty(shape, dtype=dtype, pin_memory=True)
    return zeros_lazily(shape, dtype, torch.device("cpu"))
