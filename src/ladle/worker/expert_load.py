"""Tokens per expert: the (token, expert) assignments every MoE layer counted on the device
(layers/moe.py SparseMoeBlock.expert_token_counts), summed over layers, read on the host for
/metrics and `ladle bench`.

Summed over layers keeps the metric's cardinality at num_experts series (128 for Qwen3-30B-A3B,
not 48 x 128); a hot expert in one layer still shows as its index's share. Reading must not stall
the step loop: `read()` copies the device sum into pinned memory behind the work already queued
and returns the copy the previous read started once it has landed (so a scrape lags one read
behind); `read(wait=True)` (the bench, after a run) waits for the current values.
"""

from __future__ import annotations

import torch
from torch import nn

from ladle.model.layers.moe import SparseMoeBlock


class ExpertLoadMeter:
    """The summed per-expert counts of a model's MoE layers (none: reads give ())."""

    def __init__(self, model: nn.Module) -> None:
        self._blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
        self._last: tuple[int, ...] = (0,) * self.num_experts
        self._pending: torch.Tensor | None = None
        self._copied: torch.cuda.Event | None = None

    @property
    def num_experts(self) -> int:
        return self._blocks[0].gate.num_experts if self._blocks else 0

    @property
    def num_layers(self) -> int:
        return len(self._blocks)

    def _device_sum(self) -> torch.Tensor:
        counts = self._blocks[0].expert_token_counts.clone()
        for block in self._blocks[1:]:
            counts += block.expert_token_counts
        return counts

    def read(self, wait: bool = False) -> tuple[int, ...]:
        if not self._blocks:
            return ()
        if wait or not self._blocks[0].expert_token_counts.is_cuda:
            self._pending = self._copied = None
            self._last = tuple(self._device_sum().tolist())
            return self._last
        if self._copied is not None and self._copied.query():
            self._last = tuple(self._pending.tolist())
            self._pending = self._copied = None
        if self._pending is None:
            self._pending = torch.empty(self.num_experts, dtype=torch.int64, pin_memory=True)
            self._pending.copy_(self._device_sum(), non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()
        return self._last

    def reset(self) -> None:
        """Zero every layer's counts (after the warm-up, whose made-up requests are no load)."""
        for block in self._blocks:
            block.expert_token_counts.zero_()
        self._last, self._pending, self._copied = (0,) * self.num_experts, None, None
