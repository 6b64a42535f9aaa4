"""What a model's weights amount to, as the bench's floors need it: parameters, bytes, and the
routed experts of a mixture of experts. Taken where the model lives (a worker) and sent to the
engine as plain data in WorkerInfo.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ladle.model.layers.moe import SparseMoeBlock


@dataclass(frozen=True)
class WeightCensus:
    num_params: int  # this rank's parameters (its shard under tensor parallelism)
    experts: ExpertWeights | None  # None for a dense model


@dataclass(frozen=True)
class ExpertWeights:
    """The routed experts of a mixture-of-experts model, all its sparse layers together."""

    num_experts: int
    num_experts_per_token: int
    num_params: int  # every expert's parameters (routers and dense layers excluded)
    num_bytes: int

    def share_read(self, num_tokens: int) -> float:
        """The expected share of the experts a step of num_tokens tokens reads (balanced
        routing: the docstring of ladle/bench/device_floor.py)."""
        untouched = (1 - self.num_experts_per_token / self.num_experts) ** num_tokens
        return 1.0 - untouched


def expert_weights(model: torch.nn.Module) -> ExpertWeights | None:
    """The stacked experts of a model's MoE blocks (layers/moe.py), or None for a dense model."""
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    if not blocks:
        return None
    # fp8 experts' scales are read with their codes (bytes) but are no parameters of the model.
    stacks = [t for b in blocks for t in (b.experts.gate_up_proj, b.experts.down_proj)]
    tensors = [t for block in blocks for t in block.experts.parameters()]
    return ExpertWeights(
        num_experts=blocks[0].gate.num_experts,
        num_experts_per_token=blocks[0].gate.top_k,
        num_params=sum(t.numel() for t in stacks),
        num_bytes=sum(t.numel() * t.element_size() for t in tensors),
    )


def take_census(model: torch.nn.Module) -> WeightCensus:
    return WeightCensus(
        num_params=sum(p.numel() for p in model.parameters()), experts=expert_weights(model)
    )
