"""The 4-bit GEMM on quantized activations (kernels/cpu_native/q4_int8_gemm.c, 8 and 16 bits)
against its torch reference (the same activation quantization, products in float64), at awkward
sizes: K not a multiple of 32 (padded to whole groups), N = 1, 7 and many rows shared between
threads, 1 to 130 activation rows (partial tiles of 4, partial blocks of 16 weight rows in the
interleaved AVX-512 path). test_cpu_native_paths.py runs these on the AVX2 and plain C builds."""

from __future__ import annotations

import pytest
import torch

from ladle.kernels.cpu_native.build import native_library
from ladle.kernels.cpu_native.gemv import (
    INTEGER_ACTIVATION_MAX_ROWS,
    integer_activation_max_rows,
    q4_int8_activation_matmul,
    set_activation_bits,
)
from ladle.kernels.cpu_native.int8_activation_reference import (
    q4_int8_activation_reference,
    quantize_activations_int8,
)
from ladle.model.layers.group_quant import (
    GroupQuantizedRows,
    group_quantized_matmul,
    quantize_int4_groups,
)

pytestmark = pytest.mark.skipif(native_library() is None, reason="no C compiler here")


def _weight(num_rows: int, num_columns: int, half: bool, symmetric: bool, seed: int):
    generator = torch.Generator().manual_seed(seed)
    weight = quantize_int4_groups(torch.randn(num_rows, num_columns, generator=generator), 32)
    scale, offset = weight.scale, weight.offset
    if symmetric:  # Q4_0-like codes without an offset tensor
        offset = None
    if half:  # GGUF's float16 scales and offsets
        scale = scale.half()
        offset = None if offset is None else offset.half()
    return GroupQuantizedRows(weight.codes, scale, offset, 32, 4, num_columns)


@pytest.mark.parametrize(
    ("num_x_rows", "num_rows", "num_columns"),
    [
        (1, 1, 64),
        (5, 7, 100),
        (32, 7, 576),
        (33, 1, 1000),
        (1, 1001, 576),
        (5, 1001, 1536),
        # the interleaved path (AVX-512 VNNI builds, 2 rows of x or more): 16 weight rows a
        # block, the last one partial; many blocks shared between threads; prefill-sized x
        (6, 17, 576),
        (16, 37, 1000),
        (48, 1001, 576),
        (130, 33, 1536),
    ],
)
@pytest.mark.parametrize(("half", "symmetric"), [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize("bits", [8, 16])
def test_q4_int8_gemm_matches_reference(num_x_rows, num_rows, num_columns, half, symmetric, bits):
    weight = _weight(num_rows, num_columns, half, symmetric, seed=num_rows + num_columns)
    generator = torch.Generator().manual_seed(num_x_rows)
    x = torch.randn(num_x_rows, num_columns, generator=generator)
    x[0, :7] *= 30  # an outlier group, as the residual stream has
    bias = torch.randn(num_rows, generator=generator)
    output = q4_int8_activation_matmul(x, weight, bias, bits)
    expected = q4_int8_activation_reference(x, weight, bias, bits)
    torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-3)
    # and within the activations' rounding of the float product (an outlier group coarsens it)
    exact = x.double() @ weight.dequantize().double().T + bias.double()
    assert (output.double() - exact).norm() <= (0.03 if bits == 8 else 1e-3) * exact.norm()


@pytest.mark.parametrize("bits", [8, 16])
def test_activation_quantization_round_trips(bits):
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(bits))
    x[1] = 0  # an all-zero row: scale 0, codes 0
    # a group whose scale is 1 (max 127) holding 3 + 127.75 / 256: with 16 bits its residual
    # code rounds to +128 and saturates at 127, 0.75 of a step off
    x[2, :32] = 0
    x[2, 0], x[2, 1] = 127.0, 3 + 127.75 / 256
    codes, scale, sums = quantize_activations_int8(x, bits)
    restored = codes.double().view(3, 2, 32) * scale[..., None].double()
    # half a step; with 16 bits a saturated residual (+128 -> 127) leaves one step
    steps = 0.5 if bits == 8 else 1.0
    assert (restored.view(3, 64) - x).abs().max() <= scale.max() * steps + 1e-6
    assert codes[1].eq(0).all() and scale[1].eq(0).all()
    torch.testing.assert_close(sums, x.view(3, 2, 32).sum(-1))


def test_declines_layouts_it_does_not_take():
    x = torch.randn(2, 30)
    assert q4_int8_activation_matmul(x, _weight(4, 30, True, False, 0)) is None  # one group
    group_128 = quantize_int4_groups(torch.randn(4, 256), 128)
    assert q4_int8_activation_matmul(torch.randn(1, 256), group_128) is None


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_group_matmul_takes_the_activation_bits_it_is_set_to(bits):
    weight = _weight(9, 576, True, False, 3)
    previous = set_activation_bits(bits)
    try:
        for num_x_rows in (1, 4, INTEGER_ACTIVATION_MAX_ROWS, INTEGER_ACTIVATION_MAX_ROWS + 1):
            x = torch.randn(num_x_rows, 576, generator=torch.Generator().manual_seed(num_x_rows))
            output = group_quantized_matmul(x, weight)
            # float32 activations (prefill-sized chunks too where the build limits the integer
            # path's rows): the dequantized weight's product
            max_rows = integer_activation_max_rows()
            if bits == 32 or (max_rows is not None and num_x_rows > max_rows):
                expected = (x.double() @ weight.dequantize().double().T).float()
                torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-3)
            else:
                expected = q4_int8_activation_reference(x, weight, None, bits)
                torch.testing.assert_close(output, expected, rtol=1e-4, atol=1e-3)
    finally:
        set_activation_bits(previous)
