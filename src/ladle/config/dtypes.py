"""The dtype and device spellings the engine options accept, and their resolution to torch's
objects (only in the engine: the API process validates names without importing torch)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


# torch is imported only where a dtype or device is resolved (in the engine): `ladle serve`'s
# API process builds and validates an EngineConfig but never needs torch, and importing it there
# (1.5-3 s) delays spawning the engine process by as much.
SUPPORTED_DTYPE_NAMES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}


def supported_dtypes() -> dict[str, torch.dtype]:
    """Each accepted dtype spelling and the torch dtype it names."""
    import torch

    return {name: getattr(torch, torch_name) for name, torch_name in SUPPORTED_DTYPE_NAMES.items()}


def is_torch_dtype(value: object) -> bool:
    # A torch.dtype can only exist once torch is imported; checking so keeps torch unimported.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.dtype)


def resolve_device(device: str) -> torch.device:
    """'auto' picks CUDA when present, else the CPU."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    resolved = torch.device(device)
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for but CUDA is not available")
    return resolved


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """'auto' is bfloat16 on CUDA and float32 on the CPU (where bf16 matmuls are slow, inexact)."""
    import torch

    dtypes = supported_dtypes()
    if isinstance(dtype, torch.dtype):
        if dtype not in dtypes.values():
            raise ValueError(f"dtype {dtype} is not supported; use bfloat16, float16 or float32")
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in dtypes:
        raise ValueError(
            f"dtype {dtype!r} is not supported; choose one of auto, {', '.join(dtypes)}"
        )
    return dtypes[dtype]
