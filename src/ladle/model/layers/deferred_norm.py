"""An RMSNorm handed to the projection that consumes it, to run inside that projection's launch.

A batch-1 decode step is a chain of a few hundred launches of a few microseconds each (the
Qwen3-0.6B shape: 237 a step, 57 of them RMSNorms over one 1024-wide row; docs/benchmarks.md,
session 51). Where a norm's output feeds one projection only (the decoder layer's input norm ->
qkv, post-attention norm -> gate-up) and that projection runs ladle's batch-1 GEMV, the norm
returns this object instead of running: the GEMV adds the residual, normalises the row and
multiplies by the norm weight in registers (kernels/gemv.py, its norm prologue), with
kernels/rms_norm.py's roundings, and its first program writes the new residual stream into
`new_residual`. Any other consumer calls materialize(), which runs the norm as before.

LADLE_GEMV_NORM_PROLOGUE=0 in the environment (or set_norm_prologue(False)) keeps every norm
its own launch: the before/after of the benchmarks and the tests' reference.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

NORM_PROLOGUE_ENV = "LADLE_GEMV_NORM_PROLOGUE"
_enabled = os.environ.get(NORM_PROLOGUE_ENV, "1") != "0"


def set_norm_prologue(enabled: bool) -> bool:
    """Turn the GEMV's norm prologue on or off for this process; returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, enabled
    return previous


def norm_prologue_enabled() -> bool:
    return _enabled


@dataclass(frozen=True)
class DeferredNorm:
    """weight * RMSNorm(x (+ residual)) over one row, not computed yet. `new_residual` (an empty
    buffer like residual, or None without a residual) receives x + residual when the consumer
    runs; the caller holds it as the residual stream from then on."""

    x: torch.Tensor
    weight: torch.Tensor
    eps: float
    residual: torch.Tensor | None
    new_residual: torch.Tensor | None

    @property
    def shape(self) -> torch.Size:
        """The norm output's shape, as x's (the layers read num_tokens off it)."""
        return self.x.shape

    def gemv_operands(self) -> dict:
        """The norm's keyword arguments of kernels/gemv.py's gemv and gate_up_silu."""
        return {
            "norm_weight": self.weight,
            "eps": self.eps,
            "residual": self.residual,
            "new_residual": self.new_residual,
        }

    def materialize(self) -> torch.Tensor:
        """The norm's output, computed by its own kernel (a consumer that cannot fold it in);
        new_residual is filled all the same."""
        from ladle.kernels.rms_norm import rms_norm  # CUDA only: this object exists only there

        if self.residual is None:
            return rms_norm(self.x, self.weight, self.eps)
        self.new_residual.copy_(self.residual)
        return rms_norm(self.x, self.weight, self.eps, residual=self.new_residual)
