"""The fp8 GEMV (kernels/fp8_gemv.py) under Triton's interpreter on the CPU, against the
dequantized weight's float32 matmul at awkward sizes: one row of output, N off the tile's rows,
K under one 16-input chunk, K off a power of two over several K tiles, the default model's 576;
per-channel scales and 32- and 128-wide scale groups (the last one partial); x a plain row or
e4m3 codes with their scale; with bias; the gate-up + SiLU-and-mul variant.

Skipped where Triton is not installed (it is not a dependency of the CPU install). The
interpreter runs float32 rows (numpy has no bfloat16; torch's e4m3 codes it reads as their
bytes and widens itself); the bf16 runs at the 8B's shapes are in tests/gpu/test_fp8_gemv.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers.interpreter import interpreted, parent_only, run_in_interpreter_child

from ladle.model.layers.quant.fp8 import FP8_DTYPE, quantize_fp8_per_row
from ladle.model.layers.quant.fp8_block import expand_groups, quantize_fp8_blocks

pytest.importorskip("triton")


@pytest.mark.slow  # ~15 s on a 2-core machine
@parent_only
def test_kernels_under_the_interpreter():
    run_in_interpreter_child(__file__)


@pytest.fixture
def fp8_gemv(monkeypatch):
    import triton.language as tl

    from ladle.kernels import activation, fp8_gemv

    # The interpreter has no libdevice (its stubs return None): SiLU's exp through tl.exp,
    # numpy's exp there, which rounds as libdevice's within the tolerance below.
    monkeypatch.setattr(activation, "libdevice", SimpleNamespace(exp=lambda x: tl.exp(x)))
    return fp8_gemv


def _tile(fp8_gemv):
    # 256-wide K tiles: K = 576 and 1029 take several, with a masked tail.
    return fp8_gemv.Fp8GemvTile(block_n=4, max_block_k=256, num_warps=4, num_stages=1)


def _weight(n: int, k: int, group: int, seed: int):
    """(e4m3 codes, scales [N] or [N, groups], the dequantized float32 weight)."""
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(n, k, generator=generator) / k**0.5
    if group:
        codes, scale = quantize_fp8_blocks(weight, 128, group)
        return codes, scale, codes.float() * expand_groups(scale, k, group)
    codes, scale = quantize_fp8_per_row(weight)
    return codes, scale, codes.float() * scale[:, None]


def _input(quantized: bool, k: int, seed: int):
    """(the kernel's x, its scale or None, its float32 value)."""
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(seed)) * 2
    if not quantized:
        return x, None, x
    scale = (x.abs().amax() / 448.0).reshape(1, 1)
    codes = (x / scale).to(FP8_DTYPE)
    return codes, scale, codes.float() * scale


# (N, K): one output, K under a chunk, N and K off the tile, the default model's K.
SHAPES = [(1, 16), (7, 5), (13, 576), (9, 1029)]


@interpreted
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group", [0, 32, 128])
@pytest.mark.parametrize("quantized", [False, True], ids=["row", "codes"])
def test_gemv_matches_the_dequantized_weight(fp8_gemv, n, k, group, quantized):
    codes, scale, dequantized = _weight(n, k, group, n * 100 + k)
    x, x_scale, x32 = _input(quantized, k, n + k)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(k)) if n != 7 else None
    expected = x32 @ dequantized.t() + (bias if bias is not None else 0)
    got = fp8_gemv.fp8_gemv(
        x, codes, scale, group, bias, x_scale, out_dtype=torch.float32, tile=_tile(fp8_gemv)
    )
    assert got.shape == (1, n) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@interpreted
@pytest.mark.parametrize("width,k", [(1, 16), (7, 100), (5, 576)])
@pytest.mark.parametrize("group", [0, 128])
@pytest.mark.parametrize("quantized", [False, True], ids=["row", "codes"])
def test_gate_up_silu_matches_silu_and_mul_of_the_reference(fp8_gemv, width, k, group, quantized):
    codes, scale, dequantized = _weight(2 * width, k, group, width * 100 + k)
    x, x_scale, x32 = _input(quantized, k, width)
    gate, up = (x32 @ dequantized.t()).chunk(2, dim=-1)
    got = fp8_gemv.fp8_gate_up_silu(
        x, codes, scale, group, x_scale, torch.float32, tile=_tile(fp8_gemv)
    )
    assert got.shape == (1, width)
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=1e-4, atol=1e-5)


@interpreted
def test_operands_that_do_not_fit_are_named(fp8_gemv):
    codes, scale, _ = _weight(8, 300, 128, 0)
    x = torch.randn(1, 300)
    with pytest.raises(ValueError, match="do not fit"):
        fp8_gemv.fp8_gemv(x, codes, scale, 64)  # 3 groups of 128, not 5 of 64
    with pytest.raises(ValueError, match="do not fit"):
        fp8_gemv.fp8_gemv(x, codes, scale[:, 0].contiguous(), 128)
    with pytest.raises(ValueError, match="powers of two"):
        fp8_gemv.fp8_gemv(x, codes, scale, 100)
    with pytest.raises(ValueError, match="need their scale"):
        fp8_gemv.fp8_gemv(x.to(FP8_DTYPE), codes, scale, 128)
    with pytest.raises(ValueError, match="even number of rows"):
        fp8_gemv.fp8_gate_up_silu(x, codes[:7], scale[:7], 128)
