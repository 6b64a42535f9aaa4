"""INT8 W8A8 for the GPU: int8 weights with one scale per output channel, activations quantized
per token on the fly, the GEMM on int8 tensor cores through torch._int_mm (int32 accumulators),
then both scales applied in one multiply.

    w_scale[n] = max_k |W[n, k]| / 127          W8[n, k] = round(W[n, k] / w_scale[n])
    x_scale[m] = max_k |x[m, k]| / 127          x8[m, k] = round(x[m, k] / x_scale[m])
    y[m, n]    = int32(x8 @ W8^T)[m, n] * x_scale[m] * w_scale[n]

cuBLASLt's int8 GEMM wants more than 16 rows, so decode batches are padded to 17 rows. On the
CPU torch._int_mm runs at any size (int8_linear_cpu). Where it cannot run (sizes not a multiple
of 8 on the GPU, a build without it) the same integer products are computed exactly in float64.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ladle.model.layers.quant.base import PerRowScaledMethod, add_bias, flatten_tokens

INT8_MAX = 127.0
MIN_SCALE = 1e-12
# cuBLASLt int8 GEMMs need M > 16.
MIN_INT_MM_ROWS = 17


def quantize_int8_rows(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest-even int8 per row: (codes [rows, cols], float32 scale [rows])."""
    matrix = matrix.float()
    # A reciprocal multiply, the same on CPU and CUDA (see quantize_fp8_per_row).
    scale = (matrix.abs().amax(dim=-1) * (1.0 / INT8_MAX)).clamp(min=MIN_SCALE)
    codes = torch.round((matrix / scale[:, None]).clamp(-INT8_MAX, INT8_MAX)).to(torch.int8)
    return codes, scale


def int8_linear_reference(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The W8A8 matmul computed exactly (integer products in float64), then scaled."""
    return _int8_linear_in_torch(x, weight, weight_scale, bias, _float64_products)


def int8_linear_cpu(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """The reference's numbers with the integer products from torch._int_mm on the CPU (int32
    accumulators, exact like the reference's float64 sums, and 8-17x faster at decode sizes:
    docs/quantization.md)."""
    return _int8_linear_in_torch(x, weight, weight_scale, bias, _int_mm_products)


def _float64_products(x_codes: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x_codes.double() @ weight.double().t()


def _int_mm_products(x_codes: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch._int_mm(x_codes, weight.t())


def _int8_linear_in_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    integer_products: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Per-token int8 codes of x, their exact integer products with the codes `weight`, then
    both scales (the products are integers below 2^31, so either accumulator converts to the
    same float32)."""
    x2, leading = flatten_tokens(x)
    x_codes, x_scale = quantize_int8_rows(x2)
    accumulator = integer_products(x_codes, weight)
    output = accumulator.float() * x_scale[:, None] * weight_scale[None, :]
    output = add_bias(output, None if bias is None else bias.float())
    return output.to(x.dtype).reshape(*leading, -1)


_int_mm_layout: dict[torch.device, str | None] = {}


def int_mm_weight_layout(device: torch.device) -> str | None:
    """How torch._int_mm takes the weight on this device: 'transposed' (a column-major view of
    the [N, K] codes, no copy), 'contiguous' (a [K, N] copy), or None where it does not run.
    Probed once per device, at load, outside graph capture."""
    if device.type not in ("cuda", "cpu"):
        return None
    if device not in _int_mm_layout:
        _int_mm_layout[device] = None
        a = torch.ones(MIN_INT_MM_ROWS, 32, dtype=torch.int8, device=device)
        b = torch.ones(16, 32, dtype=torch.int8, device=device)
        for layout, weight_t in (("transposed", b.t()), ("contiguous", b.t().contiguous())):
            try:
                if int(torch._int_mm(a, weight_t)[0, 0].item()) == 32:
                    _int_mm_layout[device] = layout
                    break
            except (RuntimeError, TypeError):
                continue
    return _int_mm_layout[device]


def int8_linear(
    x: torch.Tensor,
    weight_t: torch.Tensor,
    weight_scale_row: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """y = x W^T (+ bias) with W8 as its [K, N] column-major view and float32 scales [1, N]."""
    # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no triton;
    # tests/model/test_fused_kernel_dispatch.py).
    from ladle.kernels.per_token_quant import per_token_quant

    x2, leading = flatten_tokens(x)
    num_tokens = x2.shape[0]
    if num_tokens < MIN_INT_MM_ROWS:
        x2 = F.pad(x2, (0, 0, 0, MIN_INT_MM_ROWS - num_tokens))
    x_codes, x_scale = per_token_quant(x2, torch.int8)
    accumulator = torch._int_mm(x_codes, weight_t)[:num_tokens]
    output = (accumulator.float() * x_scale[:num_tokens] * weight_scale_row).to(x.dtype)
    return add_bias(output, bias).reshape(*leading, -1)


class Int8Method(PerRowScaledMethod):
    name = "int8"
    code_dtype = torch.int8

    def quantize_rows(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_int8_rows(weight)

    def finalize(self, layer: nn.Module) -> None:
        rows, cols = layer.weight.shape
        layout = int_mm_weight_layout(layer.weight.device)
        # On the CPU _int_mm takes any size and the codes' transposed view (int8_linear_cpu).
        layer.int_mm_on_cpu = layout == "transposed" and not layer.weight.is_cuda
        if not layer.weight.is_cuda:
            layer.use_int_mm = False
            return
        layer.use_int_mm = layout is not None and rows % 8 == 0 and cols % 8 == 0
        if layer.use_int_mm and layout == "contiguous":
            layer.register_buffer("weight_t", layer.weight.data.t().contiguous())
        elif layer.use_int_mm:
            layer.weight_t = layer.weight.data.t()

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if layer.use_int_mm:
            return int8_linear(x, layer.weight_t, layer.weight_scale[None, :], layer.bias)
        if layer.int_mm_on_cpu:
            return int8_linear_cpu(x, layer.weight, layer.weight_scale, layer.bias)
        return int8_linear_reference(x, layer.weight, layer.weight_scale, layer.bias)
