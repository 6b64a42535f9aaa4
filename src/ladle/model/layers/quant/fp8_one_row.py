"""Batch-1 decode of the fp8 methods (fp8.py's per-channel scales, fp8_block.py's block scales):
one row on CUDA goes through the fp8 GEMV (kernels/fp8_gemv.py) instead of the W8A8 GEMM.

At one row a projection is bound by reading its weight; the W8A8 GEMM reads it through 16-row
tensor-core tiles on few programs and needs x quantized per token by a launch of its own (the
o and down projections, whose producers do not quantize). The GEMV reads the e4m3 codes with
x as it comes: the bf16 row (weight-only, no quantization at all), or the QuantizedActivation an
RMSNorm already made (its codes times its scale). On an H200, W3-8b (`ladle bench latency
--workload W3-8b --runs 2 --no-busy --quantization fp8`) decodes 2.864 ms/token through the GEMV
against 4.581 on the W8A8 path (LADLE_FP8_GEMV=0, same call) and bf16's 4.229: 1.17x the
weight-bandwidth floor of 2.455 ms (2026-11-29).

Every decision here depends on shapes, dtypes and settings fixed at load (one row, CUDA,
LADLE_FUSED_KERNELS, the layer's `runs_fp8_gemv` set by finalize), never on values: a CUDA
graph captured for batch 1 replays the same kernels. LADLE_FP8_GEMV=0 in the environment at
load keeps one row on the W8A8 path (the benchmarks' before/after). Triton and the kernel module
are imported only once a call takes this path (a CPU install has no triton).
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ladle.kernels.dispatch import use_fused_kernels
from ladle.model.layers.quantized_activation import QuantizedActivation

FP8_GEMV_ENV = "LADLE_FP8_GEMV"


def can_run_fp8_gemv(device: torch.device) -> bool:
    """Whether one row takes the fp8 GEMV on `device` (asked at load): NVIDIA from Ada (sm_89)
    on, where Triton widens e4m3 in hardware (older GPUs have no e4m3 type in Triton; ROCm's fp8
    is another format), unless LADLE_FP8_GEMV=0."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    if os.environ.get(FP8_GEMV_ENV, "1") == "0":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def _one_row(
    layer: nn.Module, x: torch.Tensor | QuantizedActivation
) -> tuple[torch.Tensor, torch.Tensor | None, torch.dtype] | None:
    """(the row [1, K] the kernel reads, its scale or None, the output dtype) when x is one row
    the GEMV takes for this layer, else None."""
    if not layer.runs_fp8_gemv:
        return None
    if isinstance(x, QuantizedActivation):
        row, scale, dtype = x.codes, x.scale, x.dtype
    else:
        row, scale, dtype = x, None, x.dtype
    if row.dim() != 2 or row.shape[0] != 1 or not use_fused_kernels(row):
        return None
    from ladle.kernels.fp8_gemv import fp8_gemv_applies  # CUDA only: see the module's note

    if not fp8_gemv_applies(row, layer.weight) or dtype not in (torch.bfloat16, torch.float16):
        return None
    return row, scale, dtype


def one_row_matmul(
    layer: nn.Module, x: torch.Tensor | QuantizedActivation, scale_group: int
) -> torch.Tensor | None:
    """x W^T (+ bias) [1, N] for one row through the fp8 GEMV, or None where it does not apply
    (more rows, the CPU, the fused kernels off, a GPU before Ada). scale_group: the inputs per
    weight scale group (0: one scale per output channel)."""
    one_row = _one_row(layer, x)
    if one_row is None:
        return None
    from ladle.kernels.fp8_gemv import fp8_gemv  # CUDA only: see the module's note

    row, scale, dtype = one_row
    return fp8_gemv(
        row, layer.weight, layer.weight_scale, scale_group, layer.bias, scale, out_dtype=dtype
    )


def one_row_gate_up_silu(
    layer: nn.Module, x: torch.Tensor | QuantizedActivation, scale_group: int
) -> torch.Tensor | None:
    """silu(gate) * up [1, d] of a merged [gate; up] layer (equal halves, no bias) for one row
    in one launch, or None where the fp8 GEMV does not apply (as one_row_matmul)."""
    one_row = _one_row(layer, x)
    if one_row is None:
        return None
    from ladle.kernels.fp8_gemv import fp8_gate_up_silu  # CUDA only: see the module's note

    row, scale, dtype = one_row
    return fp8_gate_up_silu(row, layer.weight, layer.weight_scale, scale_group, scale, dtype)
