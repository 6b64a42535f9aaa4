"""SiLU-and-multiply, the gated activation of Llama-family MLPs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ladle.kernels.cpu_native.decode_ops import silu_and_mul as cpu_silu_and_mul
from ladle.kernels.dispatch import use_fused_kernels
from ladle.model.layers.quantized_activation import QuantizedActivation


class SiluAndMul(nn.Module):
    """Input [..., 2 * d] is the merged gate_up projection; output [..., d] = silu(gate) * up.
    On CUDA one Triton launch (kernels/activation.py) instead of three; on the CPU in float32
    one C call (kernels/cpu_native/silu_and_mul.c).

    When its output feeds an fp8 projection (the down projection), `output_quantization` is set
    at load (quant/input_fusion.py) and the CUDA kernel returns the output quantized per token,
    a QuantizedActivation, in place of the bf16 tensor (from 64 rows; fewer run SiLU-and-mul and
    leave the quantization to the projection).
    """

    # The code dtype the consumer takes its input in, or None (a plain tensor); set at load.
    output_quantization: torch.dtype | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor | QuantizedActivation:
        if use_fused_kernels(x):
            # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
            # triton; tests/model/test_fused_kernel_dispatch.py).
            from ladle.kernels.activation import (
                silu_and_mul,
                silu_and_mul_quant,
                silu_and_mul_quant_applies,
            )

            # Batches below 64 rows run the pair: one program a row leaves most SMs idle there.
            if self.output_quantization is not None and silu_and_mul_quant_applies(x):
                codes, scale = silu_and_mul_quant(x, self.output_quantization)
                return QuantizedActivation(codes, scale, x.dtype)

            return silu_and_mul(x)
        native = cpu_silu_and_mul(x)  # one C call on the CPU in float32, else None
        if native is not None:
            return native
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
