"""FP8 W8A8: float8 e4m3 weights with one scale per output channel, activations quantized per
token on the fly, the GEMM through torch._scaled_mm with row-wise scales (cuBLASLt's FP8 tensor
cores on Hopper), or at decode batches up to 64 rows (128 for projections up to 4096 columns)
ladle's Triton kernel (kernels/fp8_matmul.py), which reads the weight faster there.

    w_scale[n] = max_k |W[n, k]| / 448          W8[n, k] = e4m3(W[n, k] / w_scale[n])
    x_scale[m] = max_k |x[m, k]| / 448          x8[m, k] = e4m3(x[m, k] * (1 / x_scale[m]))
    y[m, n]    = (x8 @ W8^T)[m, n] * x_scale[m] * w_scale[n]

Where _scaled_mm cannot run (the CPU, a GPU before Ada, sizes not a multiple of 16) the same
numbers are computed by dequantizing both sides: slower, same quantization error. On the CPU
the weight is dequantized to float32 once at load (4 bytes a weight; the load says so).

At one row on CUDA (batch-1 decode) the projections take the fp8 GEMV instead
(fp8_one_row.py): the weight's codes times x as it comes, no per-token quantization.

The input may also come already quantized (a QuantizedActivation from an RMSNorm or SiLU-and-mul
kernel that quantized its own output, quant/input_fusion.py): its codes and scales are the ones
quantize_activation_fp8 would compute from the bf16 tensor, so the result is the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ladle.model.layers.quant.base import PerRowScaledMethod, add_bias, flatten_tokens
from ladle.model.layers.quant.fp8_one_row import (
    can_run_fp8_gemv,
    one_row_gate_up_silu,
    one_row_matmul,
)
from ladle.model.layers.quantized_activation import QuantizedActivation

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
# Scales never reach zero, so an all-zero row or token quantizes to zeros instead of NaN.
MIN_SCALE = 1e-12


def quantize_fp8_per_row(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 codes [rows, cols], float32 scale [rows]) with each row's max mapped to 448."""
    matrix = matrix.float()
    # Multiply by the reciprocal, never divide by a Python scalar: CUDA turns that division into
    # this multiply and the CPU does not, and the scales must match bit for bit on both (a
    # checkpoint written on the CPU loads to the logits the GPU quantizes to in memory).
    scale = (matrix.abs().amax(dim=-1) * (1.0 / FP8_MAX)).clamp(min=MIN_SCALE)
    codes = (matrix / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes, scale


def dequantize_stack(
    codes: torch.Tensor, scale: torch.Tensor, scale_group: int, dtype: torch.dtype
) -> torch.Tensor:
    """codes [E, N, K] times their scales ([E, N], or [E, N, G] for groups of scale_group
    inputs) in float32, rounded once to dtype: fp8 expert stacks (layers/moe_fp8.py) as floats."""
    values = codes.float()
    if scale.dim() == 2:
        return (values * scale[..., None]).to(dtype)
    columns = values.shape[-1]
    expanded = scale.repeat_interleave(scale_group, dim=-1)[..., :columns]
    return (values * expanded).to(dtype)


def fp8_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The fp8 matmul's numbers in float32 torch: both sides quantized, then dequantized."""
    x2, leading = flatten_tokens(x)
    x_codes, x_scale = _activation_codes_in_torch(x2)
    output = _dequantized_matmul(x_codes, x_scale, weight, weight_scale, bias)
    return output.to(x.dtype).reshape(*leading, -1)


def _dequantized_matmul(
    x_codes: torch.Tensor,
    x_scale: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """(x_codes * x_scale [M, 1]) @ (weight * weight_scale [N])^T (+ bias) in float32."""
    dequantized = weight.float() * weight_scale[:, None]
    return _dequantized_activation_matmul(x_codes, x_scale, dequantized, bias)


def _dequantized_activation_matmul(
    x_codes: torch.Tensor,
    x_scale: torch.Tensor,
    dequantized_weight: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """(x_codes * x_scale [M, 1]) @ dequantized_weight^T (+ bias) in float32."""
    output = (x_codes.float() * x_scale) @ dequantized_weight.t()
    return add_bias(output, None if bias is None else bias.float())


_scaled_mm_works: dict[torch.device, bool] = {}


def can_use_scaled_mm(device: torch.device) -> bool:
    """Whether torch._scaled_mm with row-wise scales runs here: probed once per device, outside
    any graph capture (finalize runs at load), because its support depends on the GPU and build."""
    if device.type != "cuda":
        return False
    if device not in _scaled_mm_works:
        try:
            a = torch.ones(16, 16, device=device).to(FP8_DTYPE)
            scale_a = torch.ones(16, 1, device=device)
            scale_b = torch.ones(1, 16, device=device)
            out = torch._scaled_mm(
                a, a.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16
            )
            _scaled_mm_works[device] = bool(out[0, 0].item() == 16.0)
        except (RuntimeError, TypeError):
            _scaled_mm_works[device] = False
    return _scaled_mm_works[device]


def quantize_activation_fp8(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token e4m3 codes [M, K] and float32 scales [M, 1] of a [M, K] activation."""
    if x2.is_cuda:
        # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
        # triton; tests/model/test_fused_kernel_dispatch.py).
        from ladle.kernels.per_token_quant import per_token_quant

        return per_token_quant(x2, FP8_DTYPE)
    return _activation_codes_in_torch(x2)


def _activation_codes_in_torch(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """per_token_quant's codes and scales by its torch rule, the same bits (imported here: the
    rule is torch only, and ladle.kernels stays off the CPU's import path until an fp8 layer
    runs there)."""
    from ladle.kernels.per_token_rule import per_token_quant_reference

    return per_token_quant_reference(x2, FP8_DTYPE)


def activation_codes(
    x: torch.Tensor | QuantizedActivation,
) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...], torch.dtype]:
    """(e4m3 codes [M, K], float32 scales [M, 1], leading shape, output dtype) of an input:
    quantized here from a tensor [..., K], or handed over already quantized."""
    if isinstance(x, QuantizedActivation):
        if x.codes.dtype != FP8_DTYPE:
            raise ValueError(f"an fp8 projection got {x.codes.dtype} activation codes")
        return x.codes, x.scale, (x.codes.shape[0],), x.dtype
    x2, leading = flatten_tokens(x)
    codes, scale = quantize_activation_fp8(x2)
    return codes, scale, leading, x.dtype


def fp8_linear(
    x: torch.Tensor | QuantizedActivation,
    weight_t: torch.Tensor,
    weight_scale_row: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """y = x W^T (+ bias) with W8 given as its [K, N] column-major view and scales [1, N]; x a
    tensor [..., K] or an already quantized activation [M, K]."""
    x_codes, x_scale, leading, dtype = activation_codes(x)
    # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no triton;
    # tests/model/test_fused_kernel_dispatch.py).
    from ladle.kernels.fp8_matmul import FAST_ACCUMULATION, decode_tile, fp8_matmul

    tile = decode_tile(x_codes.shape[0], weight_t.shape[1])
    if tile is not None:
        # Decode sizes: ladle's kernel tiles the output finer than cuBLASLt (more SMs reading
        # the weight); the same codes, scales and bfloat16 result.
        output = fp8_matmul(x_codes, weight_t.t(), x_scale, weight_scale_row, tile)
    else:
        # Row-wise scaling is implemented for bfloat16 outputs only.
        output = torch._scaled_mm(
            x_codes,
            weight_t,
            scale_a=x_scale,
            scale_b=weight_scale_row,
            out_dtype=torch.bfloat16,
            use_fast_accum=FAST_ACCUMULATION,
        )
    output = add_bias(output.to(dtype), bias)
    return output.reshape(*leading, -1)


class Fp8Method(PerRowScaledMethod):
    name = "fp8"
    code_dtype = FP8_DTYPE

    def quantize_rows(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_fp8_per_row(weight)

    def finalize(self, layer: nn.Module) -> None:
        weight = layer.weight.data
        rows, cols = weight.shape
        layer.use_scaled_mm = can_use_scaled_mm(weight.device) and rows % 16 == 0 and cols % 16 == 0
        layer.runs_fp8_gemv = can_run_fp8_gemv(weight.device)
        if not weight.is_cuda:
            # The CPU has no fp8 matmul (torch._scaled_mm there is a reference loop, 2 ms for
            # a 1536 x 576 weight at batch 1): the weight is dequantized to float32 once, the
            # very values the per-call dequantization computed, and the codes freed.
            dequantized = weight.float() * layer.weight_scale.data[:, None]
            del layer.weight, layer.weight_scale
            layer.weight = None
            layer.register_buffer("weight_dequantized", dequantized)

    def input_quantization(self, layer: nn.Module) -> torch.dtype | None:
        # Only the _scaled_mm / Triton GEMM path takes codes straight from the producer.
        return FP8_DTYPE if layer.use_scaled_mm else None

    def gate_up_silu(
        self, layer: nn.Module, x: torch.Tensor | QuantizedActivation
    ) -> torch.Tensor | None:
        return one_row_gate_up_silu(layer, x, scale_group=0)

    def apply(self, layer: nn.Module, x: torch.Tensor | QuantizedActivation) -> torch.Tensor:
        output = one_row_matmul(layer, x, scale_group=0)  # one row on CUDA, else None
        if output is not None:
            return output
        if layer.use_scaled_mm:
            return fp8_linear(x, layer.weight.t(), layer.weight_scale[None, :], layer.bias)
        codes, scale, leading, dtype = activation_codes(x)
        if codes.is_cuda:  # an unaligned size on the GPU: dequantize the weight for this call
            weight = layer.weight.to(dtype) * layer.weight_scale[:, None].to(dtype)
            x_dq = (codes.to(dtype) * scale.to(dtype)).reshape(*leading, -1)
            return F.linear(x_dq, weight, layer.bias)
        output = _dequantized_activation_matmul(codes, scale, layer.weight_dequantized, layer.bias)
        return output.to(dtype).reshape(*leading, -1)
