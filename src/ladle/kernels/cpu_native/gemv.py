"""Decode-sized matmuls on quantized CPU weights, through the C kernels: 1 to 4 rows of float32
activations (int8 rows, group-quantized rows), and 4-bit group-32 rows times activations
quantized to 8 or 16 bits (any count of rows; group_quant.py uses it up to
`integer_activation_max_rows()`).

Each function returns None when its kernel does not apply (no library, a shape or dtype it does
not take, more rows than it takes), and the caller runs its torch path. A float32-activation
result is the float32 product of x with the dequantized weight, up to the order of the sums (the
torch references are `dequantize_int8_per_row` and `GroupQuantizedRows.dequantize`); a quantized
one is that of int8_activation_reference.py.
"""

from __future__ import annotations

import os
from typing import Protocol

import torch

from ladle.kernels.cpu_native.build import kernel_threads, native_library


class GroupQuantizedRows(Protocol):
    """What these kernels read of model/layers/group_quant.py's GroupQuantizedRows (the layer
    calls the kernels, so the kernels name its shape here instead of importing it)."""

    @property
    def codes(self) -> torch.Tensor: ...
    @property
    def scale(self) -> torch.Tensor: ...
    @property
    def offset(self) -> torch.Tensor | None: ...
    @property
    def group_size(self) -> int: ...
    @property
    def bits(self) -> int: ...
    @property
    def num_columns(self) -> int: ...
    @property
    def num_rows(self) -> int: ...
    @property
    def padded_columns(self) -> int: ...

# The kernels keep one accumulator per (row of x, output row) in registers: up to 4 rows of x.
MAX_ROWS = 4

# 4-bit group-32 weights (the GGUF 4-bit types) multiply activations quantized per group of 32
# (q4_int8_gemm.c): 8 bits (one int8 code each, llama.cpp's Q4 x Q8 numerics), 16 bits (a code
# and a residual code, two integer passes: the float32 product to ~5 significant digits), or
# 32 (float32 activations: group_gemv.c up to 4 rows, exactly the dequantized weight's product
# up to summation order, else dequantize-then-MKL). Measured choice: docs/quantization.md.
ACTIVATION_BITS_ENV = "LADLE_CPU_ACTIVATION_BITS"
DEFAULT_ACTIVATION_BITS = 16
ACTIVATION_BITS = (8, 16, 32)
# Above this many rows (prefill chunks) MKL on dequantized chunks was faster than the integer
# path on 2 cores (crossover at 56-64 rows for 16 bits), and its product is exact; a build with
# the interleaved AVX-512 VNNI path has no such limit (integer_activation_max_rows).
INTEGER_ACTIVATION_MAX_ROWS = 48


def _activation_bits_from_environment() -> int:
    value = os.environ.get(ACTIVATION_BITS_ENV, str(DEFAULT_ACTIVATION_BITS))
    if not value.isdigit() or int(value) not in ACTIVATION_BITS:
        raise ValueError(f"{ACTIVATION_BITS_ENV}={value!r}: choose one of {ACTIVATION_BITS}")
    return int(value)


_activation_bits = _activation_bits_from_environment()


def set_activation_bits(bits: int) -> int:
    """The 4-bit layers' activation bits for this process (tests and benches compare them);
    returns the previous setting."""
    global _activation_bits
    if bits not in ACTIVATION_BITS:
        raise ValueError(f"activation bits {bits}: choose one of {ACTIVATION_BITS}")
    previous, _activation_bits = _activation_bits, bits
    return previous


def activation_bits() -> int:
    return _activation_bits


def integer_activation_max_rows() -> int | None:
    """The most rows of x for which the 4-bit layers take the integer kernel (None: any)."""
    library = native_library()
    if library is not None and library.ladle_q4_int8_gemm_interleaved():
        return None
    return INTEGER_ACTIVATION_MAX_ROWS


def _fits(x: torch.Tensor, weight_device: torch.device) -> bool:
    return (
        x.dim() == 2
        and 1 <= x.shape[0] <= MAX_ROWS
        and x.device.type == "cpu"
        and weight_device.type == "cpu"
        and not x.requires_grad
    )


def _pointer(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _has_kernel_layout(weight: GroupQuantizedRows) -> bool:
    """Contiguous codes, and float32 or float16 scales (and offsets of the same dtype)."""
    scale, offset = weight.scale, weight.offset
    if not weight.codes.is_contiguous() or not scale.is_contiguous():
        return False
    if scale.dtype not in (torch.float32, torch.float16):
        return False
    return offset is None or (offset.dtype == scale.dtype and offset.is_contiguous())


def _float32_bias(bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if bias is None else bias.contiguous().float()


def _padded_float32(x: torch.Tensor, weight: GroupQuantizedRows) -> torch.Tensor:
    """x as contiguous float32, zero-padded to the weight's padded columns: the kernels read
    whole groups, and zeros in the padded columns add nothing."""
    x32 = x.contiguous().float()
    if weight.padded_columns != weight.num_columns:
        x32 = torch.nn.functional.pad(x32, (0, weight.padded_columns - weight.num_columns))
    return x32


def _group32_kernel_applies(x: torch.Tensor, weight: GroupQuantizedRows, bits: int) -> bool:
    """What q4_int8_gemm.c's entry points need of their operands besides the codes' kind: a
    CPU matrix x as wide as the weight, and the weight's codes in groups of 32 in the kernels'
    layout."""
    return (
        x.dim() == 2
        and x.device.type == "cpu"
        and not x.requires_grad
        and weight.bits == bits
        and weight.group_size == 32
        and weight.codes.device.type == "cpu"
        and x.shape[1] == weight.num_columns
        and _has_kernel_layout(weight)
    )


def int8_rows_gemv(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor | None:
    """x [M, K] @ (codes [N, K] int8 * scale [N, 1])^T (+ bias), in x's dtype; None if the
    kernel does not apply."""
    library = native_library()
    if library is None or not _fits(x, codes.device) or codes.dtype != torch.int8:
        return None
    num_rows, num_columns = codes.shape
    if x.shape[1] != num_columns or not codes.is_contiguous():
        return None
    x32 = x.contiguous().float()
    scale32 = scale.contiguous().float()
    bias32 = _float32_bias(bias)
    output = torch.empty(x.shape[0], num_rows, dtype=torch.float32)
    status = library.ladle_int8_gemv(
        x32.data_ptr(), x.shape[0], num_columns, codes.data_ptr(), scale32.data_ptr(),
        _pointer(bias32), output.data_ptr(), num_rows, kernel_threads(),
    )  # fmt: skip
    if status != 0:
        return None
    return output.to(x.dtype)


def group_rows_gemv(
    x: torch.Tensor, weight: GroupQuantizedRows, bias: torch.Tensor | None = None
) -> torch.Tensor | None:
    """x [M, K] @ weight^T (+ bias), in x's dtype; None if the kernel does not apply (it needs
    groups of a multiple of 16 columns and, for 4-bit codes, padded columns a multiple of 32,
    so that every 16-column vector of either nibble half lies in one group)."""
    library = native_library()
    if library is None or not _fits(x, weight.codes.device):
        return None
    padded = weight.padded_columns
    if weight.group_size % 16 or (weight.bits == 4 and padded % 32):
        return None
    if x.shape[1] != weight.num_columns or not _has_kernel_layout(weight):
        return None
    scale, offset = weight.scale, weight.offset
    x32 = _padded_float32(x, weight)
    bias32 = _float32_bias(bias)
    output = torch.empty(x.shape[0], weight.num_rows, dtype=torch.float32)
    status = library.ladle_group_gemv(
        x32.data_ptr(), x.shape[0], padded, weight.bits, weight.group_size,
        weight.codes.data_ptr(), scale.data_ptr(), _pointer(offset),
        int(scale.dtype == torch.float16), _pointer(bias32), output.data_ptr(), weight.num_rows,
        kernel_threads(),
    )  # fmt: skip
    if status != 0:
        return None
    return output.to(x.dtype)


def q4_int8_activation_matmul(
    x: torch.Tensor, weight: GroupQuantizedRows, bias: torch.Tensor | None = None, bits: int = 8
) -> torch.Tensor | None:
    """x [M, K] @ weight^T (+ bias) for 4-bit codes in groups of 32 (GGUF Q4_0/Q4_1/Q4_K) with
    x quantized per group of 32 on the fly to `bits` 8 or 16 (q4_int8_gemm.c: integer dot
    products, the offsets applied to x's float group sums), in x's dtype, any M; None if the
    kernel does not apply (no library, other codes, an odd number of groups)."""
    library = native_library()
    if library is None or not _group32_kernel_applies(x, weight, 4) or weight.padded_columns % 64:
        return None
    x32 = _padded_float32(x, weight)
    padded = weight.padded_columns
    bias32 = _float32_bias(bias)
    scale, offset = weight.scale, weight.offset
    output = torch.empty(x.shape[0], weight.num_rows, dtype=torch.float32)
    status = library.ladle_q4_int8_gemm(
        x32.data_ptr(), x.shape[0], padded, bits, weight.codes.data_ptr(), scale.data_ptr(),
        _pointer(offset), int(scale.dtype == torch.float16), _pointer(bias32),
        output.data_ptr(), weight.num_rows, kernel_threads(),
    )  # fmt: skip
    if status != 0:
        return None
    return output.to(x.dtype)


def q8_int8_activation_matmul(
    x: torch.Tensor, weight: GroupQuantizedRows, bias: torch.Tensor | None = None, bits: int = 16
) -> torch.Tensor | None:
    """x [M, K] @ weight^T (+ bias) for 8-bit codes in groups of 32 without offsets (GGUF Q8_0:
    the default model's tied LM head) with x quantized per group of 32 to `bits` 8 or 16, as
    q4_int8_activation_matmul does (q4_int8_gemm.c's interleaved paths), in x's dtype; None if
    the kernel does not apply (a build without them: plain C or AVX-512 without VNNI; one row;
    another layout)."""
    library = native_library()
    if library is None or not _group32_kernel_applies(x, weight, 8) or weight.offset is not None:
        return None
    x32 = _padded_float32(x, weight)
    padded = weight.padded_columns
    bias32 = _float32_bias(bias)
    scale = weight.scale
    output = torch.empty(x.shape[0], weight.num_rows, dtype=torch.float32)
    status = library.ladle_q8_int8_gemm(
        x32.data_ptr(), x.shape[0], padded, bits, weight.codes.data_ptr(), scale.data_ptr(),
        int(scale.dtype == torch.float16), _pointer(bias32), output.data_ptr(), weight.num_rows,
        kernel_threads(),
    )  # fmt: skip
    if status != 0:
        return None
    return output.to(x.dtype)


def group_dequantize_rows(
    weight: GroupQuantizedRows, start: int, count: int
) -> torch.Tensor | None:
    """float32 [count, padded_columns] of rows start..start+count in one C pass; None if the
    kernel does not apply (then `group_quant._dequantize_rows`'s torch code, its reference)."""
    library = native_library()
    if library is None or weight.codes.device.type != "cpu" or not _has_kernel_layout(weight):
        return None
    scale, offset = weight.scale, weight.offset
    output = torch.empty(count, weight.padded_columns, dtype=torch.float32)
    status = library.ladle_group_dequantize(
        weight.codes.data_ptr(), scale.data_ptr(), _pointer(offset),
        int(scale.dtype == torch.float16), weight.padded_columns, weight.bits,
        weight.group_size, start, count, output.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return output if status == 0 else None
