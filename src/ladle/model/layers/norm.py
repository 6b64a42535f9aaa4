"""RMSNorm, with an optional fused residual add (the decoder layer's add-then-normalise)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ladle.kernels.cpu_native.decode_ops import add_rms_norm
from ladle.kernels.dispatch import use_fused_kernels
from ladle.model.layers.deferred_norm import DeferredNorm, norm_prologue_enabled
from ladle.model.layers.quantized_activation import QuantizedActivation

# What a norm returns: its output, that output quantized for an fp8 projection, or the norm
# itself for its consumer's GEMV to run (deferred_norm.py).
NormOutput = torch.Tensor | QuantizedActivation | DeferredNorm


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in float32 as Hugging Face does.

    Called as norm(x) it returns the normalised x. Called as norm(x, residual) it first adds x to
    the residual stream and returns (normalised sum, new residual): the decoder layer then keeps
    one running residual tensor instead of re-adding it in three places. On CUDA one fused Triton
    launch does either (kernels/rms_norm.py), on the CPU in float32 one C call
    (kernels/cpu_native/rms_norm.c), and the new residual is the residual tensor passed in,
    updated in place; x may be a strided [tokens, heads, head_dim] view (Qwen3's q/k norm).

    When its output feeds an fp8 projection, `output_quantization` is set at load
    (quant/input_fusion.py) and the CUDA kernel returns that output quantized per token, a
    QuantizedActivation, in place of the bf16 tensor.

    `into` names the projection that alone consumes the output: where it can fold the norm into
    its batch-1 GEMV (Linear.takes_deferred_norm), the norm returns a DeferredNorm and a fresh
    residual buffer that the projection's launch fills (deferred_norm.py).
    """

    # The code dtype the consumer takes its input in, or None (a plain tensor); set at load.
    output_quantization: torch.dtype | None = None

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        # Empty, not ones: the weight always comes from a checkpoint (or the dummy filler).
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        if input_dtype == torch.float32:
            # One op instead of six (the CPU's decode step has 61 norms); in float32 it is the
            # same computation as the lines below, bit for bit.
            return F.rms_norm(x, (self.hidden_size,), self.weight, self.eps)
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        # Cast back before the weight multiply, as HF does, so bf16 results match its rounding.
        return self.weight * (x32 * torch.rsqrt(variance + self.eps)).to(input_dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, into: nn.Module | None = None
    ) -> NormOutput | tuple[NormOutput, torch.Tensor]:
        if use_fused_kernels(x):
            deferred = self._defer_to(into, x, residual)
            if deferred is not None:
                return deferred if residual is None else (deferred, deferred.new_residual)
            return self._forward_fused(x, residual)
        # On the CPU, float32: one C call (kernels/cpu_native), the residual updated in place
        # as on CUDA; None where it does not apply.
        native = add_rms_norm(x, residual, self.weight, self.eps)
        if native is not None:
            return native
        if residual is None:
            return self._normalize(x)
        residual = x + residual
        return self._normalize(residual), residual

    def _defer_to(
        self, consumer: nn.Module | None, x: torch.Tensor, residual: torch.Tensor | None
    ) -> DeferredNorm | None:
        """This norm for `consumer` to run in its GEMV, or None where it runs here."""
        if consumer is None or self.output_quantization is not None:
            return None
        if not (norm_prologue_enabled() and consumer.takes_deferred_norm(x, self.weight, residual)):
            return None
        new_residual = None if residual is None else torch.empty_like(residual)
        return DeferredNorm(x, self.weight, self.eps, residual, new_residual)

    def _forward_fused(
        self, x: torch.Tensor, residual: torch.Tensor | None
    ) -> NormOutput | tuple[NormOutput, torch.Tensor]:
        # One launch instead of ~9; the new residual is written into the residual tensor itself
        # (the decoder layers hand it on and never read the old value again).
        # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
        # triton; tests/model/test_fused_kernel_dispatch.py).
        from ladle.kernels.rms_norm import rms_norm, rms_norm_quant

        if self.output_quantization is not None and self._can_quantize_output(x, residual):
            codes, scale = rms_norm_quant(
                x, self.weight, self.eps, self.output_quantization, residual=residual
            )
            quantized = QuantizedActivation(codes, scale, x.dtype)
            return quantized if residual is None else (quantized, residual)

        if residual is None:
            return rms_norm(x, self.weight, self.eps)
        if not _residual_fits(x, residual):
            residual = (x + residual).contiguous()
            return rms_norm(residual, self.weight, self.eps), residual
        return rms_norm(x, self.weight, self.eps, residual=residual), residual

    def _can_quantize_output(self, x: torch.Tensor, residual: torch.Tensor | None) -> bool:
        """Whether rms_norm_quant takes these operands (else the plain kernel runs and the
        consumer quantizes): the decoder's [tokens, hidden] rows in the weight's dtype."""
        rows_fit = x.dim() == 2 and x.stride(1) == 1 and x.dtype == self.weight.dtype
        return rows_fit and (residual is None or _residual_fits(x, residual))

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"


def _residual_fits(x: torch.Tensor, residual: torch.Tensor) -> bool:
    """Whether the fused kernels can add into and write back this residual tensor in place."""
    return residual.shape == x.shape and residual.dtype == x.dtype and residual.is_contiguous()
