"""Random weights for a model of a preset's (or a local config.json's) shape: for benchmarks and
tests that need a model's size and speed but not its answers."""

from __future__ import annotations

import torch
from torch import nn

# Small enough that activations stay finite in bf16 through dozens of layers.
DUMMY_WEIGHT_STD = 0.02


@torch.no_grad()
def fill_dummy_weights(model: nn.Module, seed: int) -> None:
    """Fill every parameter in place: norm weights with ones (as a freshly trained model starts),
    everything else from N(0, DUMMY_WEIGHT_STD). Deterministic for a given seed and device."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
            continue
        generator = generators.get(param.device)
        if generator is None:
            generator = torch.Generator(device=param.device).manual_seed(seed)
            generators[param.device] = generator
        param.normal_(0.0, DUMMY_WEIGHT_STD, generator=generator)
