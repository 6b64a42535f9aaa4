"""Group-wise integer weights for the CPU: int4 (`--quantization int4`, GGUF Q4_0/Q4_1/Q4_K) and
int8 with group scales (GGUF Q8_0/Q6_K), one float scale and offset per group of columns:

    w[n, k] = code[n, k] * scale[n, k // group_size] + offset[n, k // group_size]

The offset is the value of code 0 (the "zero" of asymmetric formats, stored as a float so GGUF's
Q4_1/Q4_K minima are kept exactly); symmetric formats have none. int4 codes are packed two per
byte, byte j of a row holding column j (low nibble) and column j + padded_columns/2 (high), so
unpacking writes two contiguous halves. Columns are padded to whole groups; padded columns are
never read by the matmul.

The matmul, where ladle's C kernels are built: 4-bit codes in groups of 32 (the GGUF 4-bit
types), any number of rows with AVX-512 VNNI (else up to 48), multiply activations quantized
per group of 32 with integer dot products (kernels/cpu_native/q4_int8_gemm.c): to 16 bits by
default (two int8 passes, the float32 product to ~5 digits), or 8 (llama.cpp's Q4 x Q8
numerics) or 32 (float32) with LADLE_CPU_ACTIVATION_BITS (kernels/cpu_native/gemv.py); other
layouts, up to 4 rows, widen the codes to float32 in registers (group_gemv.c). Otherwise one
cache-sized chunk of rows at a time is converted to float32 for MKL (no full float32 copy
exists): measured faster than torch's `_weight_int4pack_mm_for_cpu` at batch 32 by ~10x and
level with it at batch 1 (docs/quantization.md). 8-bit codes in groups of 32 without offsets
(GGUF Q8_0: the default model's tied LM head), from 2 rows with AVX-512 VNNI, take the same
integer dot products (docs/quantization.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ladle.kernels.cpu_native.gemv import (
    activation_bits,
    group_dequantize_rows,
    group_rows_gemv,
    integer_activation_max_rows,
    q4_int8_activation_matmul,
    q8_int8_activation_matmul,
)

# float32 elements of weight converted per chunk: 1 MiB, so the chunk stays in L2 while the
# matmul reads it.
CHUNK_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class GroupQuantizedRows:
    """Rows [N, num_columns] of a weight in a group-wise integer layout (see the module doc)."""

    codes: torch.Tensor  # bits 8: int8 [N, padded]; bits 4: uint8 [N, padded // 2]
    scale: torch.Tensor  # float32 or float16 (GGUF's own, exact) [N, groups]
    offset: torch.Tensor | None  # the scale's dtype, [N, groups], or None (symmetric)
    group_size: int
    bits: int
    num_columns: int

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"group-quantized weights have 4 or 8 bits, not {self.bits}")
        if self.group_size < 1 or (self.bits == 4 and self.group_size % 2):
            raise ValueError(f"bad group size {self.group_size} for {self.bits}-bit codes")
        num_groups = -(-self.num_columns // self.group_size)
        expected_codes = num_groups * self.group_size * self.bits // 8
        if self.codes.dim() != 2 or self.codes.shape[1] != expected_codes:
            raise ValueError(
                f"codes of shape {tuple(self.codes.shape)} do not hold {self.num_columns} "
                f"columns in groups of {self.group_size} at {self.bits} bits"
            )
        for name in ("scale", "offset"):
            tensor = getattr(self, name)
            if tensor is not None and tuple(tensor.shape) != (self.num_rows, num_groups):
                raise ValueError(
                    f"{name} of shape {tuple(tensor.shape)} should be {(self.num_rows, num_groups)}"
                )

    @property
    def num_rows(self) -> int:
        return self.codes.shape[0]

    @property
    def num_groups(self) -> int:
        return self.scale.shape[1]

    @property
    def padded_columns(self) -> int:
        return self.num_groups * self.group_size

    @property
    def layout(self) -> tuple[int, int, bool, int]:
        """What must match for two row blocks to be stacked into one weight."""
        return (self.bits, self.group_size, self.offset is not None, self.num_columns)

    @property
    def num_bytes(self) -> int:
        tensors = [self.codes, self.scale] + ([self.offset] if self.offset is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    def map_rows(self, function: Callable[[torch.Tensor], torch.Tensor]) -> GroupQuantizedRows:
        """The same weight with `function` (a row slice or permutation) applied to every part."""
        offset = None if self.offset is None else function(self.offset)
        return replace(self, codes=function(self.codes), scale=function(self.scale), offset=offset)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [N, num_columns] (the reference of the matmul)."""
        return _dequantize_rows(self, 0, self.num_rows)[:, : self.num_columns]


def stack_rows(blocks: list[GroupQuantizedRows]) -> GroupQuantizedRows:
    """Row blocks of one layout stacked into one weight (merged q/k/v or gate/up)."""
    if len({block.layout for block in blocks}) != 1:
        raise ValueError("row blocks of different group-quantized layouts cannot be stacked")
    first = blocks[0]
    offset = None
    if first.offset is not None:
        offset = torch.cat([block.offset for block in blocks])
    return replace(
        first,
        codes=torch.cat([block.codes for block in blocks]),
        scale=torch.cat([block.scale for block in blocks]),
        offset=offset,
    )


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes 0..15 [N, padded] (padded even) -> [N, padded // 2], halves in the nibbles."""
    half = codes.shape[1] // 2
    return codes[:, :half] | (codes[:, half:] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4."""
    return torch.cat((packed & 0x0F, packed >> 4), dim=1)


def quantize_int4_groups(weight: torch.Tensor, group_size: int = 128) -> GroupQuantizedRows:
    """Round-to-nearest asymmetric int4 over groups of `group_size` columns (the last group may
    be partial): scale = (max - min) / 15 and offset = min per group, codes = round((w - min) /
    scale). Every value is within scale / 2 of the original."""
    if group_size < 2 or group_size % 2:
        raise ValueError(f"int4 group size must be even and at least 2, not {group_size}")
    weight = weight.float()
    num_rows, num_columns = weight.shape
    padding = (-num_columns) % group_size
    # Pad with each row's last value, so padding never widens the last group's range.
    padded = torch.cat((weight, weight[:, -1:].expand(num_rows, padding)), dim=1)
    groups = padded.view(num_rows, -1, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15).clamp(min=1e-12)
    codes = torch.round((groups - low[..., None]) / scale[..., None]).clamp_(0, 15)
    packed = pack_int4(codes.to(torch.uint8).view(num_rows, -1))
    return GroupQuantizedRows(packed, scale, low, group_size, 4, num_columns)


def group_rows_from_zero_points(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int
) -> GroupQuantizedRows:
    """The layout above for int4 codes with integer zero points (GPTQ/AWQ, `--quantization
    int4`'s canonical tensors): codes uint8 0..15 [N, K], scale and zero [N, G], standing for
    (code - zero) * scale. The offset -zero * scale is kept in float32, where it and code * scale
    are exact (an 11-bit scale times 4-bit integers), so code * scale + offset is the same
    float32 weight as (code - zero) * scale."""
    num_rows, num_columns = codes.shape
    num_groups = scale.shape[1]
    # Padded columns hold code 0; the kernels never read them (their inputs are zero-padded).
    padded = F.pad(codes, (0, num_groups * group_size - num_columns))
    scale32 = scale.float().contiguous()
    offset = (-zero.float() * scale32).contiguous()
    return GroupQuantizedRows(pack_int4(padded), scale32, offset, group_size, 4, num_columns)


def _dequantize_rows(weight: GroupQuantizedRows, start: int, count: int) -> torch.Tensor:
    """float32 [count, padded_columns] of rows start..start+count (one C pass where it applies,
    kernels/cpu_native/gemv.py; the torch code below is its reference)."""
    native = group_dequantize_rows(weight, start, count)
    if native is not None:
        return native
    codes = weight.codes[start : start + count]
    if weight.bits == 4:
        codes = unpack_int4(codes)
    values = codes.float().view(count, weight.num_groups, weight.group_size)
    values.mul_(weight.scale[start : start + count, :, None])
    if weight.offset is not None:
        values.add_(weight.offset[start : start + count, :, None])
    return values.view(count, weight.padded_columns)


def group_quantized_matmul(
    x: torch.Tensor, weight: GroupQuantizedRows, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] @ weight^T (+ bias). 4-bit groups of 32 (up to 48 rows without AVX-512
    VNNI: gemv.integer_activation_max_rows): activations
    quantized to 8 or 16 bits and integer dot products (unless LADLE_CPU_ACTIVATION_BITS=32);
    else up to 4 rows (decode): the C kernel that widens the codes in registers
    (kernels/cpu_native/gemv.py), reading each weight's own bits once; otherwise, or without
    them, one chunk of rows at a time dequantized for MKL."""
    bits = activation_bits()
    max_rows = integer_activation_max_rows() if bits < 32 else 0
    if x.dim() == 2 and bits < 32 and (max_rows is None or x.shape[0] <= max_rows):
        kernel = q8_int8_activation_matmul if weight.bits == 8 else q4_int8_activation_matmul
        output = kernel(x, weight, bias, bits)
        if output is not None:
            return output
    output = group_rows_gemv(x, weight, bias)
    if output is not None:
        return output
    num_columns = weight.num_columns
    rows_per_chunk = max(1, CHUNK_ELEMENTS // weight.padded_columns)
    outputs = [
        F.linear(x, _dequantize_rows(weight, start, count)[:, :num_columns].to(x.dtype))
        for start in range(0, weight.num_rows, rows_per_chunk)
        for count in [min(rows_per_chunk, weight.num_rows - start)]
    ]
    output = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
    if bias is not None:
        output = output + bias
    return output


def group_quantized_embedding(input_ids: torch.Tensor, weight: GroupQuantizedRows) -> torch.Tensor:
    """Rows of a group-quantized table for token ids: only the looked-up rows are converted."""
    rows = weight.map_rows(lambda tensor: tensor[input_ids.reshape(-1)])
    return rows.dequantize().reshape(*input_ids.shape, weight.num_columns)
