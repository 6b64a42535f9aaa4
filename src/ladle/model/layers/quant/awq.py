"""Activation-aware input scaling for int4 (the idea of AWQ, Lin et al. 2023): a projection's
weight columns are multiplied by s and its inputs divided by s before quantizing, where

    s_k = rms_k ** alpha / normalisation      rms_k = sqrt(H[k, k]), H = mean x x^T

so columns that meet large inputs get a finer grid. y = (x / s) (W s)^T is unchanged in
float, and 1/s is folded where it is exact (calibration.py): into the RMSNorm weight before
q/k/v and before gate/up, and into the up projection's rows before down (down's input is
silu(gate) * up, linear in up). alpha is searched per projection on the calibration inputs'
output error, tr(dW H dW^T) with dW = Q(W s) / s - W, over ALPHAS (0 = no scaling, so the search
never ends worse than the clipping search alone). The quantizer is the activation-weighted
clipping search (int4_clip.py) on the scaled problem, whose inputs' second moments are
H[k, k] / s_k^2.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
# (weight [N, K], importance [K]) -> the dequantized quantized weight [N, K] (float32)
ImportanceQuantizer = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def input_scales(hessian: torch.Tensor, alpha: float) -> torch.Tensor:
    """s [K] = rms ** alpha, normalised so that max(s) * min(s) = 1 (the weights' range neither
    grows nor shrinks overall); inputs never seen (rms 0) get the smallest seen rms."""
    rms = hessian.diagonal().float().clamp(min=0).sqrt()
    seen = rms > 0
    floor = rms[seen].min() if bool(seen.any()) else rms.new_tensor(1.0)
    scales = torch.where(seen, rms, floor) ** alpha
    return scales / (scales.max() * scales.min()).sqrt()


@torch.no_grad()
def search_input_scales(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    quantize: ImportanceQuantizer,
    alphas: tuple[float, ...] = ALPHAS,
) -> torch.Tensor:
    """The s [K] of least output error tr(dW H dW^T) among `alphas` for weight [N, K]."""
    weight = weight.float()
    hessian = hessian.float()
    importance = hessian.diagonal().clamp(min=0)
    best_error, best_scales = None, None
    for alpha in alphas:
        scales = input_scales(hessian, alpha)
        image = quantize(weight * scales, importance / scales**2) / scales
        delta = (image - weight).double()
        error = float(((delta @ hessian.double()) * delta).sum())
        if best_error is None or error < best_error:
            best_error, best_scales = error, scales
    return best_scales
