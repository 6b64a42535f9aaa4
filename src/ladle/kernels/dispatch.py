"""When the layers and the sampler take their fused Triton kernels instead of the torch code.

On CUDA the fused kernels are the default; LADLE_FUSED_KERNELS=0 in the environment turns them
off (the torch path every CPU run takes), which is how the benchmarks measure before/after and a
user rules them out when chasing a numerical difference. Nothing here imports Triton: the kernel
modules are imported only inside the CUDA branches that call them.
"""

from __future__ import annotations

import os

import torch

_enabled = os.environ.get("LADLE_FUSED_KERNELS", "1") != "0"


def set_fused_kernels(enabled: bool) -> bool:
    """Turn the fused kernels on or off for this process; returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, enabled
    return previous


def fused_kernels_enabled() -> bool:
    """The process-wide setting alone (a layer deciding before it has a tensor in hand)."""
    return _enabled


def use_fused_kernels(tensor: torch.Tensor) -> bool:
    """True when tensor lives on a CUDA device and the fused kernels are enabled."""
    return _enabled and tensor.is_cuda
