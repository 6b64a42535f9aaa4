"""SiLU-and-multiply, the gated activation of Llama-family MLPs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ladle.kernels.cpu_native.decode_ops import silu_and_mul as cpu_silu_and_mul
from ladle.kernels.dispatch import use_fused_kernels


class SiluAndMul(nn.Module):
    """Input [..., 2 * d] is the merged gate_up projection; output [..., d] = silu(gate) * up.
    On CUDA one Triton launch (kernels/activation.py) instead of three; on the CPU in float32
    one C call (kernels/cpu_native/silu_and_mul.c)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if use_fused_kernels(x):
            from ladle.kernels.activation import silu_and_mul

            return silu_and_mul(x)
        native = cpu_silu_and_mul(x)  # one C call on the CPU in float32, else None
        if native is not None:
            return native
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
