"""Per-token activation quantization in plain torch: the rule kernels/per_token_quant.py computes
in one launch, and what the CPU's fp8 activations use (model/layers/quant/fp8.py), so the two
give the same codes. Torch only: it imports where Triton does not exist.

    scale[m] = max(max_k |x[m, k]|, tiny) * (1 / QMAX)    (448 for e4m3, 127 for int8)
    codes[m, k] = cast(clamp(x[m, k] * (1 / scale[m])))   (int8: round half to even first)

per_group_quant_reference applies the same rule to each group of columns of a row.
"""

from __future__ import annotations

import torch

MIN_SCALE = 1e-12


def quant_max(dtype: torch.dtype) -> float:
    """The largest code of a per-token quantization to `dtype` (ValueError for other dtypes)."""
    if dtype == torch.int8:
        return 127.0
    if dtype == torch.float8_e4m3fn:
        return float(torch.finfo(dtype).max)
    raise ValueError(f"per-token quantization to {dtype} is not supported; use int8 or e4m3")


def per_token_quant_reference(
    x: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (codes [M, K] of dtype, float32 scales [M, 1]), computed in float32."""
    qmax = quant_max(dtype)
    x = x.float()
    # Times the reciprocal, as the kernel (and CUDA's division by a scalar): the CPU's true
    # division could differ by an ulp.
    scale = (x.abs().amax(dim=-1, keepdim=True) * (1.0 / qmax)).clamp(min=MIN_SCALE)
    scaled = (x * (1.0 / scale)).clamp(-qmax, qmax)
    if dtype == torch.int8:
        scaled = torch.round(scaled)
    return scaled.to(dtype), scale


def per_group_quant_reference(
    x: torch.Tensor, dtype: torch.dtype, group_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (codes [M, K] of dtype, float32 scales [M, ceil(K / group_size)]): the rule
    above applied to each run of group_size columns of a row on its own (the last run may be
    shorter), as block-scaled fp8 checkpoints quantize their activations (per token and group)."""
    num_rows, num_columns = x.shape
    num_groups = -(-num_columns // group_size)
    padded = torch.nn.functional.pad(x.float(), (0, num_groups * group_size - num_columns))
    codes, scale = per_token_quant_reference(padded.reshape(-1, group_size), dtype)
    codes = codes.reshape(num_rows, -1)[:, :num_columns]
    return codes, scale.reshape(num_rows, num_groups)
