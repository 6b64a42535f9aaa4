"""An activation already quantized per token, handed from the layer that produced it (an
RMSNorm) to the quantized projection that consumes it.

An fp8 projection quantizes its input per token before the GEMM (one launch, a bf16 round trip
through memory). When the producer is a fused Triton kernel it can quantize its own output in
registers instead and write only the codes and scales: the projection then takes this object in
place of the bf16 tensor. Which producers do so is decided once at load
(quant/input_fusion.py); the codes are the same bits as quantizing the bf16 tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QuantizedActivation:
    """codes [M, K] (float8 e4m3 or int8) and float32 per-token scales [M, 1] of an activation
    whose unquantized dtype was `dtype` (the dtype the consuming projection returns)."""

    codes: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if self.codes.dim() != 2 or self.scale.shape != (self.codes.shape[0], 1):
            raise ValueError(
                f"a quantized activation needs codes [M, K] and scales [M, 1], got "
                f"{tuple(self.codes.shape)} and {tuple(self.scale.shape)}"
            )
        if self.scale.dtype != torch.float32:
            raise ValueError(f"quantized activation scales must be float32, got {self.scale.dtype}")

    @property
    def shape(self) -> torch.Size:
        """[M, K], as the unquantized activation's (the layers read num_tokens off it)."""
        return self.codes.shape
