"""SiLU-and-multiply, the gated activation of Llama-family MLPs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """Input [..., 2 * d] is the merged gate_up projection; output [..., d] = silu(gate) * up."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
