"""8-bit group-32 weights (GGUF Q8_0: the default model's tied LM head) times activations
quantized to 8 or 16 bits (q4_int8_gemm.c's interleaved paths: AVX-512 VNNI, AVX2) against the torch
reference (the same activation quantization, products in float64), at awkward sizes: K not a
multiple of 32, N = 1 and N not a multiple of the 16-row blocks, 2 (the smallest batch it takes:
INTERLEAVED_MIN_ROWS) to 130 activation rows. Builds without those paths (plain C, AVX-512
without VNNI) decline, and the layer keeps its float path."""

from __future__ import annotations

import pytest
import torch

from ladle.kernels.cpu_native.build import kernels_path, native_library
from ladle.kernels.cpu_native.gemv import (
    integer_activation_max_rows,
    q8_int8_activation_matmul,
    set_activation_bits,
)
from ladle.kernels.cpu_native.int8_activation_reference import q4_int8_activation_reference
from ladle.model.layers.group_quant import GroupQuantizedRows, group_quantized_matmul

pytestmark = pytest.mark.skipif(native_library() is None, reason="no C compiler here")


def _has_interleaved_path() -> bool:
    return kernels_path() in ("avx512-vnni", "avx2", "avx2-vnni")


def _takes_integer_path(num_x_rows: int) -> bool:
    """Whether group_quantized_matmul multiplies this many rows on integer activations."""
    max_rows = integer_activation_max_rows()
    return (
        _has_interleaved_path() and num_x_rows >= 2 and (max_rows is None or num_x_rows <= max_rows)
    )


def _q8_0_weight(num_rows: int, num_columns: int, seed: int) -> GroupQuantizedRows:
    """Q8_0's layout: int8 codes, one float16 scale per 32 columns, symmetric."""
    generator = torch.Generator().manual_seed(seed)
    padded = -(-num_columns // 32) * 32
    weight = torch.zeros(num_rows, padded)
    weight[:, :num_columns] = torch.randn(num_rows, num_columns, generator=generator)
    groups = weight.view(num_rows, -1, 32)
    scale = (groups.abs().amax(dim=-1) / 127).clamp(min=1e-8).half()
    codes = torch.round(groups / scale.float()[..., None]).clamp(-127, 127).to(torch.int8)
    return GroupQuantizedRows(codes.view(num_rows, padded), scale, None, 32, 8, num_columns)


@pytest.mark.parametrize(
    ("num_x_rows", "num_rows", "num_columns"),
    [(2, 17, 576), (7, 1, 100), (33, 49, 1000), (32, 1001, 576), (130, 40, 1536)],
)
@pytest.mark.parametrize("bits", [8, 16])
def test_q8_int8_gemm_matches_reference(num_x_rows, num_rows, num_columns, bits):
    weight = _q8_0_weight(num_rows, num_columns, seed=num_rows + num_columns)
    generator = torch.Generator().manual_seed(num_x_rows)
    x = torch.randn(num_x_rows, num_columns, generator=generator)
    x[0, :7] *= 30  # an outlier group, as the residual stream has
    bias = torch.randn(num_rows, generator=generator)
    output = q8_int8_activation_matmul(x, weight, bias, bits)
    if not _has_interleaved_path():
        assert output is None
        return
    assert output is not None
    expected = q4_int8_activation_reference(x, weight, bias, bits)
    torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-3)
    exact = x.double() @ weight.dequantize().double().T + bias.double()
    assert (output.double() - exact).norm() <= (0.03 if bits == 8 else 1e-3) * exact.norm()


def test_declines_what_it_does_not_take():
    weight = _q8_0_weight(20, 64, seed=0)
    assert q8_int8_activation_matmul(torch.randn(1, 64), weight) is None  # one row: the GEMV
    with_offset = GroupQuantizedRows(weight.codes, weight.scale, weight.scale, 32, 8, 64)
    assert q8_int8_activation_matmul(torch.randn(8, 64), with_offset) is None


@pytest.mark.parametrize("bits", [16, 32])
def test_layer_matmul_of_q8_0_weights(bits):
    """group_quantized_matmul on Q8_0 rows: the integer product where the build has it and the
    activation bits ask for it, else the dequantized weight's float product."""
    weight = _q8_0_weight(70, 576, seed=1)
    previous = set_activation_bits(bits)
    try:
        for num_x_rows in (1, 2, 5, 32, 100):
            x = torch.randn(num_x_rows, 576, generator=torch.Generator().manual_seed(num_x_rows))
            output = group_quantized_matmul(x, weight)
            if bits < 32 and _takes_integer_path(num_x_rows):
                expected = q4_int8_activation_reference(x, weight, None, bits)
            else:
                expected = (x.double() @ weight.dequantize().double().T).float()
            torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-3)
    finally:
        set_activation_bits(previous)
