"""GGUF blocks kept in their own precision: Q8_0, Q4_0, Q4_1, Q4_K and Q6_K tensors become
ladle's group-quantized layouts (model/layers/group_quant.py) with integer repacking only, no
float32 copy of the weight:

    Q8_0  int8 codes, scale d per 32                        -> int8, group 32, symmetric
    Q6_K  6-bit codes - 32, scale d * sc per 16              -> int8, group 16, symmetric
    Q4_0  4-bit codes, scale d, zero -8 d per 32              -> int4, group 32
    Q4_1  4-bit codes, scale d, min m per 32                  -> int4, group 32
    Q4_K  4-bit codes, scale d * sc, min -dmin * m per 32     -> int4, group 32

Each format's values are exactly code * scale + offset in float32, so the kept weights equal
the dequantized ones (gguf_dequant.py); only the matmul's summation order differs. Q8_0, Q4_0
and Q4_1 keep their scales and offsets in float16, as the file stores them (exact, and the
decode kernel then reads 5 bits per 4-bit weight instead of 6); the K types' are products and
stay float32. Other types (F16, Q5_*, Q2_K, Q3_K, IQ*) are dequantized as before.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ladle.model.layers.group_quant import GroupQuantizedRows, pack_int4
from ladle.model.loader.gguf_dequant import _f16, _k_nibbles, _k_scales_and_mins

Q = GGMLQuantizationType


def _q8_0(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, int, int]:
    codes = blocks[:, :, 2:34].contiguous().view(torch.int8).reshape(blocks.shape[0], -1)
    return codes, _block_f16(blocks, 0), None, 32, 8


def _q4_0(blocks: torch.Tensor):
    scale = _block_f16(blocks, 0)
    offset = -8.0 * scale  # a power-of-two multiple: exact in float16 unless it overflows
    if not torch.isfinite(offset).all():
        scale, offset = scale.float(), -8.0 * scale.float()
    return _ggml_nibbles(blocks[:, :, 2:18]), scale, offset, 32, 4


def _q4_1(blocks: torch.Tensor):
    return _ggml_nibbles(blocks[:, :, 4:20]), _block_f16(blocks, 0), _block_f16(blocks, 2), 32, 4


def _q4_k(blocks: torch.Tensor):
    num_rows, num_blocks, type_size = blocks.shape
    flat = blocks.reshape(-1, type_size)
    scales, mins = _k_scales_and_mins(flat[:, 4:16])  # [blocks, 8] small integers as float
    scale = _f16(flat, 0) * scales
    offset = -_f16(flat, 2) * mins
    codes = _k_nibbles(flat[:, 16:144]).reshape(num_rows, -1)
    return codes, scale.view(num_rows, -1), offset.view(num_rows, -1), 32, 4


def _q6_k(blocks: torch.Tensor):
    # ql: 128 bytes, qh: 64 bytes, scales: int8[16], d: f16 (the order gguf_dequant._q6_k reads).
    num_rows, num_blocks, type_size = blocks.shape
    flat = blocks.reshape(-1, type_size)
    ql = flat[:, 0:128].reshape(-1, 2, 2, 32)
    qh = flat[:, 128:192].reshape(-1, 2, 1, 32)
    low = torch.cat((ql & 0x0F, ql >> 4), dim=2)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
    codes = ((low | (((qh >> shifts) & 3) << 4)).view(torch.int8) - 32).reshape(num_rows, -1)
    # Scale j covers values 16 j .. 16 j + 15 of the block, in the order the codes are laid out.
    sub_scales = flat[:, 192:208].contiguous().view(torch.int8).float()
    scale = (_f16(flat, 208) * sub_scales).view(num_rows, -1)
    return codes, scale, None, 16, 8


_NATIVE_DECODERS = {Q.Q8_0: _q8_0, Q.Q4_0: _q4_0, Q.Q4_1: _q4_1, Q.Q4_K: _q4_k, Q.Q6_K: _q6_k}
NATIVE_TYPES = frozenset(_NATIVE_DECODERS)


def _block_f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """A float16 field of every block, [rows, blocks] float16."""
    return blocks[:, :, start : start + 2].contiguous().view(torch.float16).squeeze(-1)


def _ggml_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Q4_0/Q4_1 quants [rows, blocks, 16 bytes] -> codes [rows, blocks * 32]: each block's low
    nibbles are its values 0..15, the high nibbles 16..31."""
    return torch.cat((packed & 0x0F, packed >> 4), dim=-1).reshape(packed.shape[0], -1)


def native_group_rows(
    raw: np.ndarray | torch.Tensor, ggml_type: int, shape: tuple[int, ...]
) -> GroupQuantizedRows:
    """A 2-D tensor's raw GGUF bytes as group-quantized rows (CPU). shape: (rows, columns).

    Raises ValueError when the type is not kept natively or the bytes do not fit the shape.
    """
    qtype = Q(ggml_type)
    decoder = _NATIVE_DECODERS.get(qtype)
    if decoder is None or len(shape) != 2:
        raise ValueError(f"{qtype.name} tensors of shape {shape} are not kept natively")
    if isinstance(raw, np.ndarray):
        raw = torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True))
    num_rows, num_columns = shape
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if num_columns % block_size or raw.numel() != num_rows * num_columns // block_size * type_size:
        raise ValueError(f"{raw.numel()} bytes do not hold a {qtype.name} tensor of shape {shape}")
    blocks = raw.reshape(num_rows, num_columns // block_size, type_size)
    codes, scale, offset, group_size, bits = decoder(blocks)
    if bits == 4:
        codes = pack_int4(codes)
    return GroupQuantizedRows(
        codes.contiguous(),
        scale.contiguous(),
        None if offset is None else offset.contiguous(),
        group_size,
        bits,
        num_columns,
    )
