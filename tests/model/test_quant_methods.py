"""The GPU quantization methods' math on the CPU: quantizers against plain per-group / per-row
loops, int4 packing round trips, and each method's matmul against a dequantized reference, at
awkward sizes (N = 1, 7, odd K, K not a multiple of the group). The GPU kernels themselves are
tested in tests/gpu/test_quant_kernels.py."""

from __future__ import annotations

import pytest
import torch

from ladle.model.layers.quant import get_quant_method, quantize_linears_
from ladle.model.layers.quant.fp8 import FP8_MAX, fp8_linear_reference, quantize_fp8_per_row
from ladle.model.layers.quant.int4 import (
    dequantize_int4_groups,
    pack_int4_rows,
    quantize_int4_groups,
    unpack_int4_rows,
)
from ladle.model.layers.quant.int8 import int8_linear_reference, quantize_int8_rows

SIZES = [(1, 7), (7, 200), (33, 128), (16, 129), (5, 300)]


def _int4_loop_reference(weight: torch.Tensor, symmetric: bool):
    """Per (row, group) with Python loops: the definition in int4.py's docstring."""
    rows, cols = weight.shape
    dequantized = torch.empty(rows, cols)
    for row in range(rows):
        for start in range(0, cols, 128):
            group = weight[row, start : start + 128].float()
            if symmetric:
                scale = float((group.abs().max() * 2 / 15).clamp(min=1e-5).half())
                zero = 8.0
            else:
                lo, hi = min(group.min().item(), 0.0), max(group.max().item(), 0.0)
                scale = float(torch.tensor((hi - lo) * (1.0 / 15.0)).clamp(min=1e-5).half())
                zero = min(max(round(-lo / scale), 1), 15)
            codes = torch.clamp(torch.round(group / scale) + zero, 0, 15)
            dequantized[row, start : start + 128] = (codes - zero) * scale
    return dequantized


@pytest.mark.parametrize("rows,cols", SIZES)
@pytest.mark.parametrize("symmetric", [False, True])
def test_int4_quantizer_matches_the_per_group_definition(rows, cols, symmetric):
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows * cols))
    codes, scale, zero = quantize_int4_groups(weight, symmetric=symmetric)
    assert codes.shape == (rows, cols) and scale.shape == zero.shape == (rows, -(-cols // 128))
    assert scale.dtype == torch.float16 and int(codes.max()) <= 15
    expected = _int4_loop_reference(weight, symmetric)
    torch.testing.assert_close(dequantize_int4_groups(codes, scale, zero), expected)
    # Round-to-nearest: every weight inside its group's range is within half a step.
    step = scale.float().repeat_interleave(128, dim=1)[:, :cols]
    error = (dequantize_int4_groups(codes, scale, zero) - weight).abs()
    assert (error <= step * (0.5 if not symmetric else 1.0) + 1e-6).float().mean() > 0.99


@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 7), (7, 8), (2, 129), (9, 300)])
def test_int4_pack_unpack_round_trip(rows, cols):
    codes = torch.randint(0, 16, (rows, cols), dtype=torch.uint8)
    packed = pack_int4_rows(codes)
    assert packed.dtype == torch.int32 and packed.shape == (rows, -(-cols // 8))
    assert torch.equal(unpack_int4_rows(packed, cols), codes)
    # Input k sits in nibble k % 8 of word k // 8, low nibble first (the kernel relies on it).
    word = int(packed[0, 0]) & 0xFFFFFFFF
    assert (word & 0xF) == int(codes[0, 0])
    if cols > 7:
        assert (word >> 28) == int(codes[0, 7])


@pytest.mark.parametrize("rows,cols", SIZES)
def test_fp8_quantizer_maps_each_row_max_to_448(rows, cols):
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(1)) * 3
    codes, scale = quantize_fp8_per_row(weight)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (rows,)
    # Exactly a reciprocal multiply: CUDA rewrites a division by a Python scalar into one, so a
    # division here would make CPU-written checkpoints differ from GPU in-memory quantization.
    assert torch.equal(scale, weight.abs().amax(dim=1) * (1.0 / FP8_MAX))
    assert torch.equal(codes.float().abs().amax(dim=1), torch.full((rows,), FP8_MAX))
    dequantized = codes.float() * scale[:, None]
    # e4m3 keeps 3 mantissa bits: relative rounding error at most 2^-4 on normal values.
    normal = (weight.abs() / scale[:, None]) > 2**-6
    relative = ((dequantized - weight).abs() / weight.abs())[normal]
    assert relative.max() <= 2**-4 + 1e-6


@pytest.mark.parametrize("rows,cols", SIZES)
def test_int8_quantizer_is_round_to_nearest_per_row(rows, cols):
    weight = torch.randn(rows, cols, generator=torch.Generator().manual_seed(2))
    codes, scale = quantize_int8_rows(weight)
    assert torch.equal(scale, weight.abs().amax(dim=1) * (1.0 / 127))
    error = (codes.float() * scale[:, None] - weight).abs()
    assert (error <= scale[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("tokens", [1, 7, 20])
def test_reference_matmuls_equal_quantize_dequantize_products(tokens):
    generator = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, 200, generator=generator)
    weight = torch.randn(7, 200, generator=generator)
    bias = torch.randn(7, generator=generator)
    codes, scale = quantize_fp8_per_row(weight)
    x_codes, x_scale = quantize_fp8_per_row(x)
    expected = (x_codes.float() * x_scale[:, None]) @ (codes.float() * scale[:, None]).t() + bias
    torch.testing.assert_close(fp8_linear_reference(x, codes, scale, bias), expected)
    codes8, scale8 = quantize_int8_rows(weight)
    x8, x_scale8 = quantize_int8_rows(x)
    expected8 = (x8.float() * x_scale8[:, None]) @ (codes8.float() * scale8[:, None]).t() + bias
    torch.testing.assert_close(int8_linear_reference(x, codes8, scale8, bias), expected8)
    # Against the float product: the quantization error stays small.
    exact = x @ weight.t() + bias
    for method, limit in (("fp8", 0.06), ("int8", 0.02)):
        output = (fp8_linear_reference if method == "fp8" else int8_linear_reference)(
            x, *(quantize_fp8_per_row if method == "fp8" else quantize_int8_rows)(weight), bias
        )
        assert ((output - exact).norm() / exact.norm()) < limit


@pytest.mark.parametrize("method", ["fp8", "int8", "int4"])
def test_quantized_linear_layer_runs_each_method_on_the_cpu(method):
    from ladle.model.layers.linear import MergedLinear

    torch.manual_seed(0)
    layer = MergedLinear(200, [7, 9], bias=True)
    layer.weight.data.normal_()
    layer.bias.data.normal_()
    weight = layer.weight.data.clone()
    quant = get_quant_method(method)
    tensors = quant.quantize(weight)
    names = quantize_linears_(torch.nn.Sequential(layer), method)
    assert names == ["0"] and layer.quant_method is not None
    assert layer.weight is None or layer.weight.dtype != torch.float32  # the float copy is gone
    x = torch.randn(5, 200)
    dequantized = quant.dequantize(tensors, 200)
    if method == "int4":
        expected = x @ dequantized.t() + layer.bias
    else:
        reference = fp8_linear_reference if method == "fp8" else int8_linear_reference
        expected = reference(x, tensors["weight"], tensors["weight_scale"], layer.bias)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    exact = x @ weight.t() + layer.bias
    limit = {"fp8": 0.06, "int8": 0.02, "int4": 0.15}[method]
    assert ((layer(x) - exact).norm() / exact.norm()) < limit


@pytest.mark.parametrize("method", ["fp8", "int8", "int4"])
@pytest.mark.parametrize("num_tokens", [1, 3, 9])
@pytest.mark.parametrize("output_size,input_size", [(1, 7), (7, 200), (33, 256), (16, 129)])
def test_cpu_runtime_layout_gives_the_reference_numbers(
    method, num_tokens, output_size, input_size
):
    """A quantized Linear finalized on the CPU (in memory or loaded from a checkpoint) runs on a
    CPU layout, never dequantizing its whole weight per call: int4 as group_quant rows (C GEMV up
    to 4 rows, chunked MKL above), int8 on torch._int_mm, fp8 on a float32 copy made once. Each
    gives its method's reference numbers: int8 and fp8 bit for bit, int4 up to summation order."""
    from ladle.model.layers.group_quant import GroupQuantizedRows
    from ladle.model.layers.linear import Linear

    generator = torch.Generator().manual_seed(output_size * 1000 + input_size)
    layer = Linear(input_size, output_size, bias=True)
    layer.weight.data = torch.randn(output_size, input_size, generator=generator)
    layer.bias.data = torch.randn(output_size, generator=generator)
    tensors = get_quant_method(method).quantize(layer.weight.data)
    quantize_linears_(torch.nn.Sequential(layer), method, float_layers=())
    x = torch.randn(num_tokens, input_size, generator=generator) * 3
    if method == "int4":
        assert isinstance(layer.quantized_weight, GroupQuantizedRows)
        assert not hasattr(layer, "weight_packed")  # no second copy of the codes
        codes = unpack_int4_rows(tensors["weight_packed"], input_size)
        dequantized = dequantize_int4_groups(codes, tensors["weight_scale"], tensors["weight_zero"])
        torch.testing.assert_close(layer.quantized_weight.dequantize(), dequantized, rtol=0, atol=0)
        expected = x @ dequantized.t() + layer.bias
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    elif method == "int8":
        assert layer.int_mm_on_cpu
        expected = int8_linear_reference(x, tensors["weight"], tensors["weight_scale"], layer.bias)
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)
    else:
        assert layer.weight is None and layer.weight_dequantized.dtype == torch.float32
        expected = fp8_linear_reference(x, tensors["weight"], tensors["weight_scale"], layer.bias)
        torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)


def test_unknown_method_is_named():
    with pytest.raises(ValueError, match="'int3'"):
        get_quant_method("int3")
