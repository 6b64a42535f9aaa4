"""The torch reference of q4_int8_gemm.c (activations quantized to 8 or 16 bits times 4-bit
or 8-bit group-32 weights), which its tests compare against: the same per-group activation
quantization, then the products in float64, so only the kernel's float32 summation order may
differ."""

from __future__ import annotations

import torch

from ladle.model.layers.group_quant import GroupQuantizedRows

GROUP = 32


def quantize_activations_int8(
    x: torch.Tensor, bits: int = 8
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x float32 [M, K] (K a multiple of 32) -> (codes [M, K], scale [M, K / 32], sums
    [M, K / 32]): per group of 32, scale = max|x| / 127 and codes = round-half-even(x * 127 /
    max|x|), in float32 as the kernel computes them; sums are the groups' float sums. bits=16:
    codes are int32, 256 times those plus the rounded (saturated int8) residual times 256, and
    the scale is divided by 256."""
    groups = x.float().view(x.shape[0], -1, GROUP)
    amax = groups.abs().amax(dim=-1)
    inverse = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    scaled = groups * inverse[..., None]
    codes = torch.round(scaled)
    scale = amax / 127.0
    if bits == 16:
        residual = torch.round((scaled - codes) * 256.0).clamp(-128, 127)
        codes = codes.to(torch.int32) * 256 + residual.to(torch.int32)
        scale = scale / 256.0
    else:
        codes = codes.to(torch.int8)
    return codes.view(x.shape), scale, groups.sum(dim=-1)


def q4_int8_activation_reference(
    x: torch.Tensor, weight: GroupQuantizedRows, bias: torch.Tensor | None = None, bits: int = 8
) -> torch.Tensor:
    """x [M, num_columns] @ weight^T (+ bias) with x quantized as the kernel does, float32."""
    padded = weight.padded_columns
    x32 = torch.nn.functional.pad(x.float(), (0, padded - weight.num_columns))
    codes, scale, sums = quantize_activations_int8(x32, bits)
    if weight.bits == 8:  # int8 codes (Q8_0)
        weight_codes = weight.codes.double()
    else:
        weight_codes = torch.cat((weight.codes & 0x0F, weight.codes >> 4), dim=1).double()
    groups = weight.num_groups
    # dots[i, n, g]: the integer dot product of group g
    dots = torch.einsum(
        "igk,ngk->ing",
        codes.double().view(-1, groups, GROUP),
        weight_codes.view(-1, groups, GROUP),
    )
    output = (dots * weight.scale.double()[None] * scale.double()[:, None]).sum(dim=-1)
    if weight.offset is not None:
        output += sums.double() @ weight.offset.double().T
    if bias is not None:
        output += bias.double()
    return output.float()
