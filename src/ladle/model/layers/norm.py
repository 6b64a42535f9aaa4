"""RMSNorm, with an optional fused residual add (the decoder layer's add-then-normalise)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension, computed in float32 as Hugging Face does.

    Called as norm(x) it returns the normalised x. Called as norm(x, residual) it first adds x to
    the residual stream and returns (normalised sum, new residual): the decoder layer then keeps
    one running residual tensor instead of re-adding it in three places.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        # Empty, not ones: the weight always comes from a checkpoint (or the dummy filler).
        self.weight = nn.Parameter(torch.empty(hidden_size), requires_grad=False)

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x32 = x.to(torch.float32)
        variance = x32.pow(2).mean(-1, keepdim=True)
        # Cast back before the weight multiply, as HF does, so bf16 results match its rounding.
        return self.weight * (x32 * torch.rsqrt(variance + self.eps)).to(input_dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self._normalize(x)
        residual = x + residual
        return self._normalize(residual), residual

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}"
