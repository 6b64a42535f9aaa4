"""fp8 experts: a StackedExperts (layers/moe.py) whose stacks hold float8_e4m3fn codes beside
float32 scales, as the Hub's fp8 MoE checkpoints store them and as `--quantization fp8` makes
them at load.

    gate_up_proj e4m3 [E, 2I, H]  gate_up_scale float32 [E, 2I] (per channel) or [E, 2I, H/b]
    down_proj    e4m3 [E, H, I]   down_scale    float32 [E, H]                or [E, H, I/b]

Block-scaled checkpoints (Qwen3-30B-A3B-FP8: `quant_method: fp8`, `weight_block_size:
[128, 128]`, `weight_scale_inv` per 128x128 block of each expert's matrix) arrive through the
checkpoint reader (loader/quantized_formats.py) as ladle's canonical per-row, per-group scales,
each block's scale repeated over its rows: kept exactly. Per-channel checkpoints give [N]
scales per expert matrix.

On the GPU the fused kernel reads the codes and widens them in registers (kernels/fused_moe.py);
the CPU has no fp8 matmul, so there the stacks are dequantized once at load into the model's
float dtype (dequantize_experts_), as the dense fp8 layers do.
"""

from __future__ import annotations

import torch
from torch import nn

from ladle.model.layers.moe import StackedExperts
from ladle.model.layers.quant.fp8 import FP8_DTYPE, quantize_fp8_per_row


def _experts(model: nn.Module) -> list[StackedExperts]:
    return [m for m in model.modules() if isinstance(m, StackedExperts)]


def has_experts(model: nn.Module) -> bool:
    return bool(_experts(model))


def _empty_scale(stack: torch.Tensor, block_columns: int | None) -> nn.Parameter:
    experts, rows, columns = stack.shape
    shape = (experts, rows) if block_columns is None else (
        experts, rows, -(-columns // block_columns)
    )  # fmt: skip
    return nn.Parameter(
        torch.empty(shape, dtype=torch.float32, device=stack.device), requires_grad=False
    )


def prepare_experts_for_fp8_checkpoint_(
    model: nn.Module, block_size: tuple[int, int] | None
) -> None:
    """Swap every expert stack for empty e4m3 codes and float32 scales that an fp8 checkpoint's
    converted tensors (weight, weight_scale per expert matrix) load into; block_size: the
    checkpoint's (rows, inputs) weight blocks, None for per-channel scales."""
    block_columns = None if block_size is None else block_size[1]
    for experts in _experts(model):
        for name in ("gate_up_proj", "down_proj"):
            stack = getattr(experts, name)
            codes = torch.empty(stack.shape, dtype=FP8_DTYPE, device=stack.device)
            setattr(experts, name, nn.Parameter(codes, requires_grad=False))
        experts.gate_up_scale = _empty_scale(experts.gate_up_proj, block_columns)
        experts.down_scale = _empty_scale(experts.down_proj, block_columns)
        experts.scale_group = block_columns or 0


@torch.no_grad()
def quantize_experts_fp8_(model: nn.Module) -> int:
    """`--quantization fp8` on a float model: every expert matrix to e4m3 with one scale per
    output channel (the dense fp8 layers' rule). One layer at a time, and its float stacks are
    dropped before the next, so the peak is one layer's codes above the float model. Returns the
    number of expert stacks quantized."""
    count = 0
    for experts in _experts(model):
        for name, scale_name in (("gate_up_proj", "gate_up_scale"), ("down_proj", "down_scale")):
            stack = getattr(experts, name)
            codes = torch.empty(stack.shape, dtype=FP8_DTYPE, device=stack.device)
            scales = torch.empty(stack.shape[:2], dtype=torch.float32, device=stack.device)
            for expert in range(stack.shape[0]):
                codes[expert], scales[expert] = quantize_fp8_per_row(stack[expert].float())
            setattr(experts, name, nn.Parameter(codes, requires_grad=False))
            setattr(experts, scale_name, nn.Parameter(scales, requires_grad=False))
            del stack
            count += 1
        experts.scale_group = 0
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return count


@torch.no_grad()
def dequantize_experts_(model: nn.Module, dtype: torch.dtype) -> int:
    """The CPU's fp8 experts: codes times scales, once, into plain float stacks of `dtype` (the
    torch path then runs them as any float model's). Returns the number of modules converted."""
    count = 0
    for experts in _experts(model):
        if not experts.is_fp8:
            continue
        gate_up, down = experts.float_stacks(dtype)
        experts.gate_up_proj = nn.Parameter(gate_up, requires_grad=False)
        experts.down_proj = nn.Parameter(down, requires_grad=False)
        experts.gate_up_scale = experts.down_scale = None
        experts.scale_group = 0
        count += 1
    return count
