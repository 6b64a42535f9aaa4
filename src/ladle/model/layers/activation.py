"""SiLU-and-multiply, the gated activation of Llama-family MLPs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ladle.kernels.dispatch import use_fused_kernels


class SiluAndMul(nn.Module):
    """Input [..., 2 * d] is the merged gate_up projection; output [..., d] = silu(gate) * up.
    On CUDA one Triton launch (kernels/activation.py) instead of three."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_fused_kernels(x):
            from ladle.kernels.activation import silu_and_mul

            return silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
