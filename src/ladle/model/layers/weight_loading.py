"""The plain weight loader: check the shape, then copy (casting dtype, moving device)."""

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
