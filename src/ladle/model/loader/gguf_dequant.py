"""GGUF block dequantization, vectorised in torch (so it runs on the GPU when given GPU bytes).

    dequantize(raw_bytes_uint8, ggml_type, shape, device) -> float32 tensor of `shape`

Every block type is unpacked for all blocks at once with tensor ops (no per-block Python), which
is ~10x faster than the `gguf` package's numpy path on a CPU and avoids its float64
intermediates. The block layouts follow ggml's `ggml-common.h` (each described where unpacked).
Types without a torch path here (Q2_K, Q3_K, the IQ types) fall back to `gguf.quants.dequantize`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType


def dequantize(
    raw: np.ndarray | torch.Tensor,
    ggml_type: int,
    shape: tuple[int, ...],
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The float32 values of one tensor's raw GGUF bytes, shaped `shape` (outermost first).

    raw: the tensor's bytes (uint8). Raises NotImplementedError for a type with no decoder here
    or in the gguf package.
    """
    qtype = Q(ggml_type)
    decoder = _DECODERS.get(qtype)
    if decoder is None:
        from gguf.quants import dequantize as numpy_dequantize

        source = raw.cpu().numpy() if isinstance(raw, torch.Tensor) else raw
        values = np.asarray(numpy_dequantize(source, qtype), dtype=np.float32)
        return torch.from_numpy(values.copy()).to(device).reshape(shape)
    if isinstance(raw, np.ndarray):
        # torch cannot wrap a read-only buffer (the memory map) without a warning: copy once.
        raw = torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True))
    raw = raw.to(device)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1, type_size)
    return decoder(blocks).reshape(shape)


def _f16(blocks: torch.Tensor, start: int, count: int = 1) -> torch.Tensor:
    """Little-endian float16 fields at byte `start` of every block, as float32 [blocks, count]."""
    return blocks[:, start : start + 2 * count].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., n] bytes -> [..., 2n]: all low nibbles, then all high nibbles (ggml's order)."""
    return torch.cat((packed & 0x0F, packed >> 4), dim=-1)


def _bits(packed: torch.Tensor, num_bits: int) -> torch.Tensor:
    """[..., n] bytes -> [..., n*8] bits, least significant first."""
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    return ((packed.unsqueeze(-1) >> shifts) & 1).reshape(*packed.shape[:-1], num_bits)


def _plain(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    def decode(blocks: torch.Tensor) -> torch.Tensor:
        return blocks.contiguous().view(dtype).float()

    return decode


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, qs: int8[32]
    scale = _f16(blocks, 0)
    return scale * blocks[:, 2:].contiguous().view(torch.int8).float()


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, qs: 16 bytes; x = (q - 8) * d
    scale = _f16(blocks, 0)
    return scale * (_nibbles(blocks[:, 2:]).float() - 8.0)


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, m: f16, qs: 16 bytes; x = q * d + m
    scale, minimum = _f16(blocks, 0), _f16(blocks, 2)
    return scale * _nibbles(blocks[:, 4:]).float() + minimum


def _q5_high_bits(qh: torch.Tensor) -> torch.Tensor:
    # qh: 4 bytes = 32 bits, bit j is the fifth bit of element j.
    return _bits(qh, 32) << 4


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, qh: 4 bytes, qs: 16 bytes; x = (q - 16) * d
    scale = _f16(blocks, 0)
    quants = _nibbles(blocks[:, 6:]) | _q5_high_bits(blocks[:, 2:6])
    return scale * (quants.float() - 16.0)


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, m: f16, qh: 4 bytes, qs: 16 bytes; x = q * d + m
    scale, minimum = _f16(blocks, 0), _f16(blocks, 2)
    quants = _nibbles(blocks[:, 8:]) | _q5_high_bits(blocks[:, 4:8])
    return scale * quants.float() + minimum


def _k_scales_and_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins per block."""
    low, middle, high = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat((low & 63, (high & 0x0F) | ((low >> 6) << 4)), dim=-1)
    mins = torch.cat((middle & 63, (high >> 4) | ((middle >> 6) << 4)), dim=-1)
    return scales.float(), mins.float()


def _k_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """128 bytes -> 8 sub-blocks of 32: each 32-byte group gives its low, then high nibbles."""
    groups = qs.reshape(-1, 4, 1, 32)
    return torch.cat((groups & 0x0F, groups >> 4), dim=2).reshape(-1, 8, 32)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    # d: f16, dmin: f16, scales: 12 bytes, qs: 128 bytes; 8 sub-blocks of 32
    scale, min_scale = _f16(blocks, 0), _f16(blocks, 2)
    scales, mins = _k_scales_and_mins(blocks[:, 4:16])
    quants = _k_nibbles(blocks[:, 16:144]).float()
    values = (scale * scales).unsqueeze(-1) * quants - (min_scale * mins).unsqueeze(-1)
    return values.reshape(-1, 256)


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    # d, dmin: f16, scales: 12 bytes, qh: 32 bytes, qs: 128 bytes; sub-block j takes bit j of qh
    scale, min_scale = _f16(blocks, 0), _f16(blocks, 2)
    scales, mins = _k_scales_and_mins(blocks[:, 4:16])
    high_bits = _bits(blocks[:, 16:48], 256).reshape(-1, 32, 8).transpose(1, 2)
    quants = (_k_nibbles(blocks[:, 48:176]) | (high_bits << 4)).float()
    values = (scale * scales).unsqueeze(-1) * quants - (min_scale * mins).unsqueeze(-1)
    return values.reshape(-1, 256)


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    # ql: 128 bytes, qh: 64 bytes, scales: int8[16], d: f16; two halves of 128 values, each
    # four rows of 32: low/high nibbles of ql[0:32], ql[32:64], with 2 bits each from qh.
    ql = blocks[:, 0:128].reshape(-1, 2, 2, 32)  # half, which 32-byte run, position
    qh = blocks[:, 128:192].reshape(-1, 2, 1, 32)
    scales = blocks[:, 192:208].contiguous().view(torch.int8).float().reshape(-1, 2, 8)
    scale = _f16(blocks, 208).reshape(-1, 1, 1)
    low = torch.cat((ql & 0x0F, ql >> 4), dim=2)  # rows 0..3: ql0 low, ql1 low, ql0 hi, ql1 hi
    shifts = torch.tensor([0, 2, 4, 6], device=blocks.device, dtype=torch.uint8).reshape(1, 1, 4, 1)
    high = (qh >> shifts) & 3
    quants = (low | (high << 4)).float() - 32.0  # [blocks, half, row, 32]
    # Scale index: 16 values per scale, so row r of half h, positions 16*s.. use scales[h, 2r+s].
    row_scales = scales.reshape(-1, 2, 4, 2, 1)
    values = quants.reshape(-1, 2, 4, 2, 16) * row_scales * scale.unsqueeze(-1).unsqueeze(-1)
    return values.reshape(-1, 256)


_DECODERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    Q.F32: _plain(torch.float32),
    Q.F16: _plain(torch.float16),
    Q.BF16: _plain(torch.bfloat16),
    Q.Q8_0: _q8_0,
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q5_0: _q5_0,
    Q.Q5_1: _q5_1,
    Q.Q4_K: _q4_k,
    Q.Q5_K: _q5_k,
    Q.Q6_K: _q6_k,
}

TORCH_DEQUANTIZED_TYPES = frozenset(_DECODERS)
