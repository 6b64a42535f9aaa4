"""Zero-filled KV cache tensors that cost nothing until they are used.

On the CPU `torch.zeros` writes every byte up front: a 1 GiB cache costs ~2 s of start-up on
a small machine, for blocks most runs never touch. Large allocations of zeroed memory through
calloc come from the kernel as untouched zero pages instead (numpy's zeros uses calloc), so
a page is paid for the first time a block on it is written. On other devices torch.zeros is
already a cheap device-side fill.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def zeros_lazily(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.zeros(shape, dtype=dtype, device=device), without touching CPU memory up front."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    element_size = torch.empty((), dtype=dtype).element_size()
    num_bytes = math.prod(shape) * element_size
    # Bytes, then reinterpreted: numpy has no bfloat16, and the bytes are zero either way.
    storage = torch.from_numpy(np.zeros(num_bytes, dtype=np.uint8))
    return storage.view(dtype).view(shape)
