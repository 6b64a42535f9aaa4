"""The host tier's memory: one allocation holding, per layer, the device cache's block layout.

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
) -> list[torch.Tensor]:
    """Per layer a [2, num_blocks, *block_shape] host tensor (views of one allocation), in the
    KV cache's dtype (fp8 stays fp8: the copies move bytes)."""
    if num_blocks < 1:
        raise ValueError(f"the host KV pool needs num_blocks >= 1, got {num_blocks}")
    shape = (num_layers, 2, num_blocks, *block_shape)
    if device.type == "cuda":
        pool = torch.empty(shape, dtype=dtype, pin_memory=True)
    else:
        pool = zeros_lazily(shape, dtype, torch.device("cpu"))
    return list(pool.unbind(0))
