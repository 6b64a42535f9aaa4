"""The plain weight loader: check the shape, then copy (casting dtype, moving device); and the
slice of a checkpoint tensor that one tensor-parallel rank loads."""

from __future__ import annotations

import torch

from ladle.model.load_errors import ModelLoadError


@torch.no_grad()
def default_weight_loader(target: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Copy a checkpoint tensor into a parameter (or a slice of one) of exactly its shape."""
    if tuple(loaded_weight.shape) != tuple(target.shape):
        raise ModelLoadError(
            f"shape {tuple(loaded_weight.shape)} does not fit {tuple(target.shape)}"
        )
    target.copy_(loaded_weight)


def rank_slice(
    loaded: torch.Tensor, dim: int, start: int, length: int, full_length: int
) -> torch.Tensor:
    """`length` entries along `dim` from `start` of a checkpoint tensor whose `dim` must be
    `full_length` long (a view, not a copy; the other dimensions are checked on the copy)."""
    if not isinstance(loaded, torch.Tensor):  # a GGUF tensor kept in its own format
        raise ModelLoadError(
            "a GGUF-quantized tensor cannot be split over tensor-parallel ranks; load a float "
            "or safetensors checkpoint, or run with tensor_parallel_size=1"
        )
    if loaded.dim() <= dim or loaded.shape[dim] != full_length:
        raise ModelLoadError(
            f"shape {tuple(loaded.shape)} does not fit: dimension {dim} should be {full_length} "
            "(the whole tensor, before it is split over tensor-parallel ranks)"
        )
    return loaded.narrow(dim, start, length)
