"""ladle's C decode matmuls (kernels/cpu_native/gemv.py) against the float64 product with the
dequantized weight, at awkward sizes: N = 1 and 7, K not a multiple of 16 or of the group."""

from __future__ import annotations

import pytest
import torch

from ladle.kernels.cpu_native.build import native_library, set_native_kernels
from ladle.kernels.cpu_native.gemv import group_rows_gemv, int8_rows_gemv
from ladle.model.layers.group_quant import GroupQuantizedRows, quantize_int4_groups
from ladle.model.layers.quantized_linear import dequantize_int8_per_row, quantize_int8_per_row

pytestmark = pytest.mark.skipif(native_library() is None, reason="no C compiler here")


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    output = x.double() @ weight.double().T
    return (output if bias is None else output + bias.double()).float()


@pytest.mark.parametrize(
    ("num_x_rows", "num_rows", "num_columns"),
    # (1, 1001, 576): enough rows to be shared out between threads, with a partial last block
    [(1, 1, 1), (1, 7, 30), (3, 9, 33), (4, 13, 576), (2, 5, 17), (1, 64, 1536), (1, 1001, 576)],
)
@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_rows_gemv_matches_dequantized_product(num_x_rows, num_rows, num_columns, with_bias):
    generator = torch.Generator().manual_seed(num_rows * num_columns)
    codes, scale = quantize_int8_per_row(torch.randn(num_rows, num_columns, generator=generator))
    x = torch.randn(num_x_rows, num_columns, generator=generator)
    bias = torch.randn(num_rows, generator=generator) if with_bias else None
    output = int8_rows_gemv(x, codes, scale, bias)
    expected = _reference(x, dequantize_int8_per_row(codes, scale), bias)
    torch.testing.assert_close(output, expected, rtol=1e-5, atol=1e-4)


def test_gemv_declines_what_it_does_not_take():
    codes, scale = quantize_int8_per_row(torch.randn(7, 32))
    assert int8_rows_gemv(torch.randn(5, 32), codes, scale) is None  # more than 4 rows
    weight = quantize_int4_groups(torch.randn(7, 24), group_size=8)  # group not a multiple of 16
    assert group_rows_gemv(torch.randn(1, 24), weight) is None
    previous = set_native_kernels(False)
    try:
        assert int8_rows_gemv(torch.randn(1, 32), codes, scale) is None
    finally:
        set_native_kernels(previous)


@pytest.mark.parametrize(
    ("num_x_rows", "num_rows", "num_columns", "group_size"),
    [
        (1, 1, 30, 32),
        (1, 7, 100, 32),
        (3, 9, 576, 32),
        (4, 7, 576, 128),
        (2, 5, 17, 16),
        (2, 1001, 576, 32),
    ],  # the last one shared out between threads
)
@pytest.mark.parametrize("half_params", [False, True])
def test_int4_group_gemv_matches_dequantized_product(
    num_x_rows, num_rows, num_columns, group_size, half_params
):
    generator = torch.Generator().manual_seed(num_rows + num_columns)
    weight = quantize_int4_groups(
        torch.randn(num_rows, num_columns, generator=generator), group_size
    )
    if half_params:  # GGUF's float16 scales and offsets
        weight = GroupQuantizedRows(
            weight.codes, weight.scale.half(), weight.offset.half(), group_size, 4, num_columns
        )
    x = torch.randn(num_x_rows, num_columns, generator=generator)
    bias = torch.randn(num_rows, generator=generator)
    output = group_rows_gemv(x, weight, bias)
    if weight.padded_columns % 32:
        assert output is None  # the nibble halves would straddle groups
        return
    torch.testing.assert_close(
        output, _reference(x, weight.dequantize(), bias), rtol=1e-5, atol=1e-4
    )


@pytest.mark.parametrize(
    ("num_x_rows", "num_rows", "num_columns", "group_size"),
    # (1, 1001, 576, 32): the default model's Q8_0 head's shape of row, shared between threads
    [(2, 1, 32, 32), (2, 7, 40, 16), (1, 1001, 576, 32), (4, 13, 100, 64), (3, 5, 17, 16)],
)
@pytest.mark.parametrize("with_offset", [False, True])
@pytest.mark.parametrize("half_params", [False, True])
def test_int8_group_gemv_matches_dequantized_product(
    num_x_rows, num_rows, num_columns, group_size, with_offset, half_params
):
    generator = torch.Generator().manual_seed(7)
    num_groups = -(-num_columns // group_size)
    codes = torch.randint(-127, 128, (num_rows, num_groups * group_size), generator=generator)
    scale = torch.rand(num_rows, num_groups, generator=generator)
    offset = torch.randn(num_rows, num_groups, generator=generator) if with_offset else None
    if half_params:  # GGUF's float16 scales
        scale, offset = scale.half(), None if offset is None else offset.half()
    weight = GroupQuantizedRows(codes.to(torch.int8), scale, offset, group_size, 8, num_columns)
    x = torch.randn(num_x_rows, num_columns, generator=generator)
    torch.testing.assert_close(
        group_rows_gemv(x, weight), _reference(x, weight.dequantize(), None), rtol=1e-5, atol=1e-3
    )


@pytest.mark.parametrize(
    ("num_rows", "num_columns", "group_size", "bits"),
    [(1, 30, 32, 4), (7, 576, 32, 4), (5, 100, 32, 4), (3, 40, 16, 8), (9, 576, 128, 4)],
)
def test_group_dequantize_rows_matches_torch(num_rows, num_columns, group_size, bits):
    from ladle.kernels.cpu_native.gemv import group_dequantize_rows

    generator = torch.Generator().manual_seed(num_rows)
    if bits == 4:
        weight = quantize_int4_groups(
            torch.randn(num_rows, num_columns, generator=generator), group_size
        )
    else:
        num_groups = -(-num_columns // group_size)
        codes = torch.randint(-127, 128, (num_rows, num_groups * group_size), generator=generator)
        scale = torch.rand(num_rows, num_groups, generator=generator).half()
        weight = GroupQuantizedRows(codes.to(torch.int8), scale, None, group_size, 8, num_columns)
    native = group_dequantize_rows(weight, 1 if num_rows > 1 else 0, num_rows // 2 or 1)
    previous = set_native_kernels(False)
    try:
        expected = weight.dequantize()
    finally:
        set_native_kernels(previous)
    half = weight.padded_columns // 2
    if bits == 4 and half % group_size:
        assert native is None  # groups straddle the nibble halves: the torch path takes it
        return
    start = 1 if num_rows > 1 else 0
    assert torch.equal(native[:, :num_columns], expected[start : start + native.shape[0]])
