"""The one-row matmul of batch-1 decode over fp8 e4m3 weights: y = x W^T (+ b) for a single row
x, in Triton, without quantizing x.

At batch 1 a projection is bound by reading its weight once, and an fp8 weight is half a bf16
one's bytes. The W8A8 GEMM (kernels/fp8_matmul.py) reads it through 16-row tensor-core tiles, 64
output columns a program (64 programs for the 8B's o and down projections: under half an H200's
132 SMs), and needs x quantized per token first (a launch of its own before o and down). Here,
as in the bf16 GEMV (kernels/gemv.py), each program owns BLOCK_N whole weight rows, streams them
in BLOCK_K-wide tiles (no split, no reduce), widens the codes to float32 in registers and
multiplies by x in float32: x is the bf16 row itself (weight-only; no quantization launch), or
a QuantizedActivation a producer already made (codes times its one per-token scale).

Weight scales, as the fp8 methods keep them (model/layers/quant/fp8.py, fp8_block.py):
    per output channel  scale [N]:     y[n] = scale[n] * sum_k w8[n, k] x[k]
    per group of inputs scale [N, G]:  y[n] = sum_g scale[n, g] * sum_{k in g} w8[n, k] x[k]
A grouped tile is [rows, groups, group width], each K tile a whole number of groups, so every
product is scaled by its own group's scale (K need not be a multiple of the group: the last one
may be partial, as fp8_block.py's scales allow).

fp8_gate_up_silu is the MLP's merged gate-up projection with SiLU-and-mul in the same launch
(gemv.py's gate_up_silu over fp8 codes): the MLP at batch 1 is two launches, and the down
projection takes SiLU-and-mul's bf16 row directly.

The result is the float32 sum (times the scales, plus the bias) rounded once to the output
dtype: x's dtype (the QuantizedActivation's for codes), as the fp8 layers return.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ladle.kernels.activation import gate_up_rows, store_silu_of_pairs
from ladle.kernels.launch import launch
from ladle.kernels.pdl import allow_next_kernel, pdl_launch, wait_for_previous_kernel

FP8_DTYPE = torch.float8_e4m3fn


@dataclass(frozen=True)
class Fp8GemvTile:
    """Weight rows a program owns, the widest K tile (a power of two; shorter K take the next
    power of two), and the launch's warps and software-pipeline stages."""

    block_n: int
    max_block_k: int
    num_warps: int
    num_stages: int


# Eight rows a program, 2048-wide K tiles, 4 warps: the best of CANDIDATE_TILES summed over the
# 8B's four projections as batch 1 runs them (qkv and gate_up on a QuantizedActivation, gate_up
# fused with SiLU-and-mul), 56.3 us a layer against 59.1 for 4 x 4096 and 54.6 had each shape
# its best; qkv 6.9 us (3.6 TB/s of fp8 weight), o 5.9, gate_up 27.3 (4.3 TB/s), down 16.2, where
# the W8A8 path (quantize, GEMM, SiLU-and-mul) took 14.0, 10.6, 32.4 and 29.8 and the bf16 GEMV
# 12.4, 8.6, 53.0 and 27.0 (scripts/fp8_gemm_bench.py --one-row on an H200, 2026-11-29).
DEFAULT_TILE = Fp8GemvTile(block_n=8, max_block_k=2048, num_warps=4, num_stages=3)
# The tiles the sweep times: 32 to 128 weight codes a thread per K tile (fewer leave the loads
# short of bytes in flight; more spill or cost programs per SM: 4 x 4096 on 4 warps is 92
# registers on sm_90a). The loop's loads feed no dot, so Triton does not pipeline them and the
# stage count changes nothing (the same SASS at 1 and 3 stages).
CANDIDATE_TILES = tuple(
    Fp8GemvTile(block_n, block_k, warps, 3)
    for warps in (4, 8)
    for block_n in (2, 4, 8, 16)
    for block_k in (1024, 2048, 4096, 8192)
    if 32 * 32 * warps <= block_n * block_k <= 128 * 32 * warps
)


# Inputs a thread sums on its own before the sum joins the accumulator: one 16-byte load of
# codes per row. Keeping the accumulator at one float per row and chunk (not per input) leaves
# the registers to more programs in flight, and a chunk lies in one scale group (groups are
# 32 inputs or more), so a group scale multiplies its sum once.
CHUNK_INPUTS = 16
CHUNK = tl.constexpr(CHUNK_INPUTS)


@triton.jit
def _tile_codes(w_ptr, row_starts, row_mask, start, K, BLOCK_K: tl.constexpr):
    """The e4m3 codes [rows, BLOCK_K] of the K tile at `start`."""
    cols = start + tl.arange(0, BLOCK_K)
    # Each weight byte is read once: keep it out of the way of what is reused (x, the scales).
    return tl.load(
        w_ptr + row_starts + cols[None, :],
        mask=row_mask[:, None] & (cols < K)[None, :],
        other=0.0,
        eviction_policy="evict_first",
    )


@triton.jit
def _tile_sums(
    codes, x_ptr, scale_ptr, scale_rows, row_mask, start, K, num_groups,
    SCALE_GROUP: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """float32 [rows, BLOCK_K // CHUNK]: the codes' products with x summed over each chunk, times
    the chunk's group scale when SCALE_GROUP > 0 (per-channel scales are left to the caller)."""
    cols = start + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + cols, mask=cols < K, other=0.0).to(tl.float32)
    products = codes.to(tl.float32) * x[None, :]
    # A [rows, BLOCK_K] tile keeps each thread's x for all its rows; the chunks are a view of it.
    sums = tl.sum(tl.reshape(products, (products.shape[0], BLOCK_K // CHUNK, CHUNK)), axis=2)
    if SCALE_GROUP > 0:
        groups = (start + tl.arange(0, BLOCK_K // CHUNK) * CHUNK) // SCALE_GROUP
        scale = tl.load(
            scale_ptr + scale_rows + groups[None, :],
            mask=row_mask[:, None] & (groups < num_groups)[None, :],
            other=0.0,
        )
        sums *= scale
    return sums


@triton.jit
def _scaled_sums(
    x_ptr,
    x_scale_ptr,
    w_ptr,
    scale_ptr,
    rows,
    row_mask,
    K,
    num_groups,
    SCALE_GROUP: tl.constexpr,
    HAS_X_SCALE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The float32 dot products of weight rows `rows` (any row indices) with x, every scale
    applied: the weight's (per channel, SCALE_GROUP == 0, or per group of SCALE_GROUP inputs)
    and, HAS_X_SCALE, x's one scale."""
    row_starts = rows[:, None].to(tl.int64) * K
    scale_rows = rows[:, None].to(tl.int64) * num_groups
    # The first K tile's codes are loaded before waiting for the kernel that writes x (under
    # PDL, kernels/pdl.py: it may still be running), the rest in the loop.
    codes = _tile_codes(w_ptr, row_starts, row_mask, 0, K, BLOCK_K)
    wait_for_previous_kernel(USE_PDL)
    acc = _tile_sums(
        codes, x_ptr, scale_ptr, scale_rows, row_mask, 0, K, num_groups, SCALE_GROUP, BLOCK_K
    )
    for start in range(BLOCK_K, K, BLOCK_K):
        codes = _tile_codes(w_ptr, row_starts, row_mask, start, K, BLOCK_K)
        acc += _tile_sums(
            codes, x_ptr, scale_ptr, scale_rows, row_mask, start, K, num_groups, SCALE_GROUP,
            BLOCK_K,
        )  # fmt: skip
    sums = tl.sum(acc, axis=1)
    if SCALE_GROUP == 0:
        sums *= tl.load(scale_ptr + rows, mask=row_mask, other=0.0)
    if HAS_X_SCALE:
        sums *= tl.load(x_scale_ptr)
    return sums


@triton.jit
def _fp8_gemv_kernel(
    x_ptr,
    x_scale_ptr,
    w_ptr,
    scale_ptr,
    bias_ptr,
    out_ptr,
    N,
    K,
    num_groups,
    SCALE_GROUP: tl.constexpr,
    HAS_X_SCALE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    allow_next_kernel(USE_PDL)  # kernels/pdl.py
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    result = _scaled_sums(
        x_ptr, x_scale_ptr, w_ptr, scale_ptr, rows, row_mask, K, num_groups, SCALE_GROUP,
        HAS_X_SCALE, BLOCK_K, USE_PDL,
    )  # fmt: skip
    if HAS_BIAS:
        result += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, result.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _fp8_gate_up_silu_kernel(
    x_ptr,
    x_scale_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    WIDTH,
    K,
    num_groups,
    SCALE_GROUP: tl.constexpr,
    HAS_X_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """silu(gate) * up for BLOCK_N features: the program reads their gate rows (w[j]) and up
    rows (w[WIDTH + j]) interleaved in one tile, then pairs the two halves of the result."""
    allow_next_kernel(USE_PDL)  # kernels/pdl.py
    rows, is_feature = gate_up_rows(WIDTH, BLOCK_N)
    result = _scaled_sums(
        x_ptr, x_scale_ptr, w_ptr, scale_ptr, rows, is_feature, K, num_groups, SCALE_GROUP,
        HAS_X_SCALE, BLOCK_K, USE_PDL,
    )  # fmt: skip
    store_silu_of_pairs(out_ptr, result, WIDTH, BLOCK_N)


def fp8_gemv_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One contiguous row (16-bit floats, or fp8 codes of a QuantizedActivation) against a
    contiguous fp8 e4m3 weight [N, K] on CUDA."""
    return (
        x.is_cuda
        and x.dim() == 2
        and x.shape[0] == 1
        and x.dtype in (torch.bfloat16, torch.float16, FP8_DTYPE)
        and x.stride(1) == 1
        and weight.dtype == FP8_DTYPE
        and weight.is_contiguous()
        and weight.shape[1] == x.shape[1]
    )


def _block_k(num_inputs: int, scale_group: int, tile: Fp8GemvTile) -> int:
    """The K tile: the next power of two of K up to the tile's widest, a whole number of scale
    groups (scale groups are powers of two) and of chunks."""
    return max(min(tile.max_block_k, triton.next_power_of_2(num_inputs)), scale_group, CHUNK_INPUTS)


def _num_groups(weight: torch.Tensor, weight_scale: torch.Tensor, scale_group: int) -> int:
    """The number of scale groups along K (1 for per-channel scales), after checking that
    weight_scale ([N], or [N, ceil(K / scale_group)]) fits the weight."""
    num_rows, num_inputs = weight.shape
    if weight_scale.dtype != torch.float32 or not weight_scale.is_contiguous():
        raise ValueError("fp8 GEMV weight scales must be contiguous float32")
    if scale_group & (scale_group - 1):
        raise ValueError(f"fp8 GEMV scale groups are powers of two, not {scale_group}")
    expected = (num_rows, -(-num_inputs // scale_group)) if scale_group else (num_rows,)
    if tuple(weight_scale.shape) != expected:
        raise ValueError(
            f"fp8 GEMV scales {tuple(weight_scale.shape)} do not fit a {num_rows} x {num_inputs} "
            f"weight in groups of {scale_group or num_inputs} inputs"
        )
    return expected[1] if scale_group else 1


def fp8_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    scale_group: int = 0,
    bias: torch.Tensor | None = None,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    tile: Fp8GemvTile = DEFAULT_TILE,
) -> torch.Tensor:
    """x [1, K] times (weight [N, K] e4m3 with its scales)^T (+ bias [N]) -> [1, N] in out_dtype
    (default x's). weight_scale is [N] (per channel, scale_group 0) or [N, ceil(K /
    scale_group)] (per row and group of scale_group inputs, a power of two). x is a 16-bit row,
    or e4m3 codes with their float32 scale x_scale (one element; then out_dtype is required).
    fp8_gemv_applies(x, weight) must hold."""
    n, k = weight.shape
    num_groups = _num_groups(weight, weight_scale, scale_group)
    out_dtype = _out_dtype(x, x_scale, out_dtype)
    out = torch.empty((1, n), dtype=out_dtype, device=x.device)
    launch(
        _fp8_gemv_kernel,
        (triton.cdiv(n, tile.block_n),),
        x,
        x_scale if x_scale is not None else weight_scale,
        weight,
        weight_scale,
        bias if bias is not None else weight_scale,
        out,
        n,
        k,
        num_groups,
        SCALE_GROUP=scale_group,
        HAS_X_SCALE=x_scale is not None,
        HAS_BIAS=bias is not None,
        BLOCK_N=tile.block_n,
        BLOCK_K=_block_k(k, scale_group, tile),
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        **pdl_launch(x.device),
    )
    return out


def fp8_gate_up_silu(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    scale_group: int = 0,
    x_scale: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    tile: Fp8GemvTile = DEFAULT_TILE,
) -> torch.Tensor:
    """silu(x gate^T) * (x up^T) for x [1, K] and the merged e4m3 weight [gate; up] [2 * d, K]
    with its scales (as fp8_gemv's) -> [1, d] in out_dtype (default x's): fp8_gemv and
    SiLU-and-mul in one launch, with the roundings of the two (fp8_gemv_applies must hold)."""
    n, k = weight.shape
    if n % 2:
        raise ValueError("a merged [gate; up] weight has an even number of rows")
    width = n // 2
    num_groups = _num_groups(weight, weight_scale, scale_group)
    out = torch.empty((1, width), dtype=_out_dtype(x, x_scale, out_dtype), device=x.device)
    # Each program reads 2 * block_half rows: the tile's rows, split into gate and up halves.
    block_half = max(1, tile.block_n // 2)
    launch(
        _fp8_gate_up_silu_kernel,
        (triton.cdiv(width, block_half),),
        x,
        x_scale if x_scale is not None else weight_scale,
        weight,
        weight_scale,
        out,
        width,
        k,
        num_groups,
        SCALE_GROUP=scale_group,
        HAS_X_SCALE=x_scale is not None,
        BLOCK_N=block_half,
        BLOCK_K=_block_k(k, scale_group, tile),
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        **pdl_launch(x.device),
    )
    return out


def _out_dtype(x: torch.Tensor, x_scale: torch.Tensor | None, out_dtype: torch.dtype | None):
    if x_scale is not None:
        if out_dtype is None or x.dtype != FP8_DTYPE or x_scale.numel() != 1:
            raise ValueError("quantized rows need e4m3 codes, one scale and an output dtype")
        return out_dtype
    if x.dtype == FP8_DTYPE:
        raise ValueError("e4m3 codes need their scale (x_scale)")
    return out_dtype or x.dtype
