"""Tokens per expert: the (token, expert) assignments every MoE layer counted on the device
(layers/moe.py SparseMoeBlock.expert_token_counts), summed over layers, read on the host for
/metrics and `ladle bench`.

Summed over layers keeps the metric's cardinality at num_experts series (128 for Qwen3-30B-A3B,
not 48 x 128); a hot expert in one layer still shows as its index's share. The meter gives the
layers' counters one [layers, experts] tensor (each layer's buffer becomes a row of it, before
any CUDA graph is captured), so a read is one sum, not one add per layer. Reading must not stall
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
        self._copied: torch.cuda.Event | None = None
        self._host: torch.Tensor | None = None
        self._table: torch.Tensor | None = None
        if self._blocks:
            first = self._blocks[0].expert_token_counts
            self._table = torch.zeros(len(self._blocks), self.num_experts, dtype=torch.int64,
                                      device=first.device)  # fmt: skip
            for row, block in zip(self._table, self._blocks, strict=True):
                block.expert_token_counts = row
            if first.is_cuda:
                self._host = torch.empty(self.num_experts, dtype=torch.int64, pin_memory=True)

    @property
    def num_experts(self) -> int:
        return self._blocks[0].gate.num_experts if self._blocks else 0

    @property
    def num_layers(self) -> int:
        return len(self._blocks)

    def read(self, wait: bool = False) -> tuple[int, ...]:
        if self._table is None:
            return ()
        if wait or self._host is None:
            if self._copied is not None:
                self._copied.synchronize()  # the copy in flight writes the host buffer
                self._copied = None
            self._last = tuple(self._table.sum(dim=0).tolist())
            return self._last
        if self._copied is not None and self._copied.query():
            self._last = tuple(self._host.tolist())
            self._copied = None
        if self._copied is None:
            self._host.copy_(self._table.sum(dim=0), non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()
        return self._last

    def reset(self) -> None:
        """Zero every layer's counts (after the warm-up, whose made-up requests are no load)."""
        if self._table is None:
            return
        if self._copied is not None:
            self._copied.synchronize()
        self._table.zero_()
        self._last, self._copied = (0,) * self.num_experts, None
