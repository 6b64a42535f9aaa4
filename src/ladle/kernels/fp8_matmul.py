"""FP8 W8A8 matmul for decode batches (up to 64 rows, 128 for narrow projections):
y = (x8 @ W8^T) * x_scale[m] * w_scale[n].

cuBLASLt's row-wise-scaled FP8 kernel (torch._scaled_mm) tiles N by 128 without splitting K,
so at decode sizes a narrow projection of the 8B shape (qkv 6144, o and down 4096 wide) runs on
32-48 of the H100's 132 SMs, and its weight, read once per step, streams at 1.8 TB/s over a
step's projections (docs/benchmarks.md). This kernel tiles N finer (more programs for the same
weight) and keeps everything else the same: e4m3 codes into the tensor cores, a float32
accumulator, both scales applied once in the epilogue, a bfloat16 result.

Block-scaled checkpoints (DeepSeek's and Qwen3-FP8's 128x128 weight blocks, activations per
token and group of 128 inputs) take the same kernel with `grouped` scales: one K step is one
group, and each step's product is scaled by that group's two scales before it joins the sum:
    y = sum_g (x8[:, g] @ W8[:, g]^T) * x_scale[m, g] * w_scale[n, g]
grouped_tile() picks its tiles at any row count and block width (cuBLASLt's block-scaled
kernel needs K a multiple of 128, which the default model's 576 is not).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ladle.kernels.pdl import allow_next_kernel, pdl_launch, wait_for_previous_kernel


@dataclass(frozen=True)
class Fp8Tile:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4
    # K elements the tensor cores may sum at reduced precision before the float32 accumulator
    # takes them (tl.dot's max_num_imprecise_acc; None = Triton's default for fp8, which on
    # Hopper's wgmma, the 64-row tiles, is the whole K).
    max_imprecise_acc: int | None = None


# Above this many token rows cuBLASLt's kernel takes every call (scripts/fp8_gemm_bench.py on an
# H100, fast accumulation in both: at 256 rows it is as fast or faster on the 8B's projections).
MAX_TOKENS = 128
# From 65 to MAX_TOKENS rows only projections this narrow take the Triton tiles: at 128 rows
# cuBLASLt runs o and down (4096 columns) on 32 CTAs, 13.3 and 36.5 us against the 64-row tiles'
# 9.7 and 29.8, while qkv (6144) is a tie (14.6 against 14.8) and gate_up (28672) fills the GPU.
NARROW_COLUMNS = 4096
# Hopper's fp8 tensor cores sum products at reduced precision unless the kernel promotes them
# into a float32 accumulator every so often ("fast accumulation"). vLLM's CUTLASS fp8 kernels and
# cuBLASLt's use_fast_accum run without promotion; ladle does too by default, for the fp8 GEMMs
# on wgmma or cuBLASLt: the 64-row tiles and above 64 rows (the 16-row tiles use mma.sync,
# which sums at full precision). scripts/fp8_tile_precision_probe.py: relative error against
# float32 over the same codes 2.1-3.4e-3 instead of 1.7e-3 (the bfloat16 rounding), beside the
# 3.7e-2 of the fp8 weights themselves. LADLE_FP8_FAST_ACCUM=0 promotes every
# PRECISE_ACCUMULATION products (tl.dot's max_num_imprecise_acc) and asks cuBLASLt for its
# precise kernel.
FAST_ACCUMULATION = os.environ.get("LADLE_FP8_FAST_ACCUM", "1") != "0"
PRECISE_ACCUMULATION = 128


def decode_tile(
    num_tokens: int, num_columns: int, fast_accumulation: bool = FAST_ACCUMULATION
) -> Fp8Tile | None:
    """The tile for a call of num_tokens rows, or None to take torch._scaled_mm. From the
    sweeps of scripts/fp8_gemm_bench.py and scripts/fp8_tile_precision_probe.py on an H100 (the
    8B's four projections at 1-128 rows): 64 columns, 256-wide K steps; up to 32 rows 16-row
    tiles (mma.sync, always full precision: a second row of programs rereads the weight from
    L2), except the widest layers (gate_up), where that reread costs and 64-row tiles win from 17
    rows on; 64-row tiles (wgmma) up to 64 rows, and up to MAX_TOKENS rows for the narrow
    projections (NARROW_COLUMNS)."""
    if num_tokens > MAX_TOKENS or (num_tokens > 64 and num_columns > NARROW_COLUMNS):
        return None
    wide = num_columns >= 16384
    if num_tokens <= 16 or (num_tokens <= 32 and not wide):
        return Fp8Tile(block_m=16, block_n=64, block_k=256, num_stages=3 if wide else 4)
    return Fp8Tile(
        block_m=64,
        block_n=64,
        block_k=256,
        num_stages=3 if wide else 4,
        max_imprecise_acc=None if fast_accumulation else PRECISE_ACCUMULATION,
    )


def grouped_tile(num_tokens: int, num_columns: int, group_size: int) -> Fp8Tile:
    """The grouped kernel's tile for a call of num_tokens rows with scales per group_size
    inputs (a power of two, 32 to 256): decode_tile's shapes with K steps of one group, and wider
    tiles for prefill-sized calls."""
    if num_tokens <= 16 or (num_tokens <= 32 and num_columns < 16384):
        return Fp8Tile(block_m=16, block_n=64, block_k=group_size)
    if num_tokens <= 64:
        return Fp8Tile(block_m=64, block_n=64, block_k=group_size)
    if num_tokens <= 256:
        return Fp8Tile(block_m=64, block_n=128, block_k=group_size, num_stages=3)
    # 128 x 256 x 3 stages of two fp8 operands would fill 192 KiB of shared memory.
    stages = 2 if group_size > 128 else 3
    return Fp8Tile(block_m=128, block_n=128, block_k=group_size, num_warps=8, num_stages=stages)


@triton.jit
def _load_weight_tile(w_rows, cols, is_n, in_k):
    return tl.load(
        w_rows + cols[None, :],
        mask=is_n[:, None] & in_k[None, :],
        other=0.0,
        eviction_policy="evict_first",  # read once a step
    )


@triton.jit
def _add_product(
    acc,
    x,
    w,
    x_scale_ptr,
    w_scale_ptr,
    offs_m,
    offs_n,
    is_m,
    is_n,
    group,
    num_groups,
    GROUPED: tl.constexpr,
    MAX_IMPRECISE_ACC: tl.constexpr,
):
    """acc + x @ w^T; with GROUPED scales (one K step = one group of columns) the step's product
    is scaled by its group's activation and weight scales before it joins the sum."""
    if GROUPED:
        x_scale = tl.load(x_scale_ptr + offs_m * num_groups + group, mask=is_m, other=0.0)
        w_scale = tl.load(w_scale_ptr + offs_n * num_groups + group, mask=is_n, other=0.0)
        product = tl.dot(x, tl.trans(w), max_num_imprecise_acc=MAX_IMPRECISE_ACC)
        return acc + product * x_scale[:, None] * w_scale[None, :]
    return tl.dot(x, tl.trans(w), acc, max_num_imprecise_acc=MAX_IMPRECISE_ACC)


@triton.jit(do_not_specialize=["num_tokens"])
def _fp8_matmul_kernel(
    x_ptr,
    w_ptr,
    x_scale_ptr,
    w_scale_ptr,
    out_ptr,
    num_tokens,
    N,
    K,
    stride_x,
    stride_out,
    num_groups,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUPED: tl.constexpr = False,
    MAX_IMPRECISE_ACC: tl.constexpr = None,
    USE_PDL: tl.constexpr = False,
):
    allow_next_kernel(USE_PDL)  # kernels/pdl.py
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    is_m = offs_m < num_tokens
    is_n = offs_n < N
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_x
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # The first weight tile before waiting for the kernel that writes x (under PDL it may still
    # be running: kernels/pdl.py), the rest in the loop.
    in_k = offs_k < K
    w = _load_weight_tile(w_rows, offs_k, is_n, in_k)
    wait_for_previous_kernel(USE_PDL)
    x = tl.load(x_rows + offs_k[None, :], mask=is_m[:, None] & in_k[None, :], other=0.0)
    acc = _add_product(
        acc, x, w, x_scale_ptr, w_scale_ptr, offs_m, offs_n, is_m, is_n, 0, num_groups,
        GROUPED, MAX_IMPRECISE_ACC,
    )  # fmt: skip
    for start in range(BLOCK_K, K, BLOCK_K):
        cols = start + offs_k
        in_k = cols < K
        x = tl.load(x_rows + cols[None, :], mask=is_m[:, None] & in_k[None, :], other=0.0)
        w = _load_weight_tile(w_rows, cols, is_n, in_k)
        acc = _add_product(
            acc, x, w, x_scale_ptr, w_scale_ptr, offs_m, offs_n, is_m, is_n, start // BLOCK_K,
            num_groups, GROUPED, MAX_IMPRECISE_ACC,
        )  # fmt: skip
    if not GROUPED:
        x_scale = tl.load(x_scale_ptr + offs_m, mask=is_m, other=0.0)
        w_scale = tl.load(w_scale_ptr + offs_n, mask=is_n, other=0.0)
        acc = acc * x_scale[:, None] * w_scale[None, :]
    tl.store(
        out_ptr + offs_m[:, None].to(tl.int64) * stride_out + offs_n[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=is_m[:, None] & is_n[None, :],
    )


def fp8_matmul(
    x_codes: torch.Tensor,  # [M, K] float8_e4m3fn
    weight: torch.Tensor,  # [N, K] float8_e4m3fn, row-major
    x_scale: torch.Tensor,  # [M] or [M, 1] float32; grouped: [M, G]
    w_scale: torch.Tensor,  # [N] or [1, N] float32; grouped: [N, G]
    tile: Fp8Tile,
    out_dtype: torch.dtype = torch.bfloat16,
    grouped: bool = False,
) -> torch.Tensor:
    """[M, N] in out_dtype; the scales contiguous, one float32 per row / per column, or
    `grouped`: one per row and group of tile.block_k inputs, [M, G] and [N, G] with
    G = ceil(K / block_k)."""
    num_tokens, k = x_codes.shape
    n = weight.shape[0]
    num_groups = triton.cdiv(k, tile.block_k) if grouped else 1
    expected = ((num_tokens, num_groups), (n, num_groups))
    if grouped and (tuple(x_scale.shape), tuple(w_scale.shape)) != expected:
        raise ValueError(
            f"group scales {tuple(x_scale.shape)} x {tuple(w_scale.shape)} do not fit K={k} in "
            f"groups of {tile.block_k}"
        )
    out = torch.empty((num_tokens, n), dtype=out_dtype, device=x_codes.device)
    grid = (triton.cdiv(n, tile.block_n), triton.cdiv(num_tokens, tile.block_m))
    _fp8_matmul_kernel[grid](
        x_codes,
        weight,
        x_scale,
        w_scale,
        out,
        num_tokens,
        n,
        k,
        x_codes.stride(0),
        out.stride(0),
        num_groups,
        BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        GROUPED=grouped,
        MAX_IMPRECISE_ACC=tile.max_imprecise_acc,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
        **pdl_launch(x_codes.device, num_tokens),
    )
    return out
