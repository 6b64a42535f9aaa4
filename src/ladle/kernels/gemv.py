"""The one-row matmul of batch-1 decode: y = x W^T (+ b) for a single row x, in Triton.

At batch 1 every projection is a matrix-vector product, bound by reading the weight once. On an
H100, cuBLAS's kernels for one row read the Llama-3.1-8B projections at 2.1-2.9 TB/s, and two
of them split K across programs and add a reduce kernel after; this kernel gives each program
BLOCK_N whole rows (no split, no reduce) and streams them in BLOCK_K-wide tiles: 2.5-3.2 TB/s
on the same shapes (docs/benchmarks.md, "One-row matmuls"). W3 on the 8B shape, a decode graph
of ~300 matmul launches a token, is where it pays.

The result is rounded to the weight's dtype (as cuBLAS's bf16 output is) and then stored in the
output's dtype, so the float32 logits path gives what `linear(...).float()` gives.

gate_up_silu is the MLP's merged gate-up projection with SiLU-and-mul applied in the same
launch: each program reads a few features' gate and up rows together and stores only
silu(gate) * up, one launch a layer fewer (at batch 1 on the Qwen3-0.6B shape, 28 of a decode
step's ~340), with the roundings of the two kernels it replaces.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ladle.kernels.activation import silu_times_up
from ladle.kernels.launch import launch
from ladle.kernels.pdl import allow_next_kernel, pdl_launch, wait_for_previous_kernel

# Four rows per program, 2048-wide K tiles, 4 warps: the best of 48 configurations summed over
# the decode steps of the 8B at TP=1, 2 and 4 and the 70B at TP=2 (each rank's halved or
# quartered shapes), within 0.4% of every shape taking its own best, so one tile serves every
# shape (scripts/gemv_bench.py --tp 1 2 4 on an H200, 2026-11-28; the earlier 2 rows x 8 warps
# was 1.2% slower summed, 2.9% on the 8B's o projection at TP=2).
BLOCK_N = 4
MAX_BLOCK_K = 2048
NUM_WARPS = 4
NUM_STAGES = 3
# gate_up_silu: two features a program, i.e. the same four weight rows as BLOCK_N.
GATED_BLOCK_N = BLOCK_N // 2


@triton.jit
def _load_weight_tile(w_ptr, rows, row_mask, cols, col_mask, K):
    # Each weight byte is read once: keep it out of the way of what is reused (x, bias).
    return tl.load(
        w_ptr + rows[:, None].to(tl.int64) * K + cols[None, :],
        mask=row_mask[:, None] & col_mask[None, :],
        other=0.0,
        eviction_policy="evict_first",
    )


@triton.jit
def _dot_rows(x_ptr, w_ptr, rows, row_mask, K, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr):
    """The float32 dot products of weight rows `rows` (any row indices) with the row x."""
    # The first weight tile is loaded before waiting for the kernel that writes x (under PDL,
    # kernels/pdl.py: it may still be running), the rest in the loop.
    cols = tl.arange(0, BLOCK_K)
    col_mask = cols < K
    w = _load_weight_tile(w_ptr, rows, row_mask, cols, col_mask, K)
    wait_for_previous_kernel(USE_PDL)
    x = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
    acc = w.to(tl.float32) * x[None, :]
    for start in range(BLOCK_K, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_mask = cols < K
        x = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        w = _load_weight_tile(w_ptr, rows, row_mask, cols, col_mask, K)
        acc += w.to(tl.float32) * x[None, :]
    return tl.sum(acc, axis=1)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    allow_next_kernel(USE_PDL)  # kernels/pdl.py
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    result = _dot_rows(x_ptr, w_ptr, rows, row_mask, K, BLOCK_K, USE_PDL)
    if HAS_BIAS:
        result += tl.load(bias_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    rounded = result.to(w_ptr.dtype.element_ty)
    tl.store(out_ptr + rows, rounded.to(out_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _gate_up_silu_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    WIDTH,
    K,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """silu(gate) * up for BLOCK_N features: the program reads their gate rows (w[j]) and up
    rows (w[WIDTH + j]) interleaved in one tile, then pairs the two halves of the result."""
    allow_next_kernel(USE_PDL)  # kernels/pdl.py
    pairs = tl.arange(0, 2 * BLOCK_N)
    features = tl.program_id(0) * BLOCK_N + pairs // 2
    is_feature = features < WIDTH
    rows = features + (pairs % 2) * WIDTH
    result = _dot_rows(x_ptr, w_ptr, rows, is_feature, K, BLOCK_K, USE_PDL)
    # Each projection's output rounded to the weight's dtype, as the GEMV stores it and
    # SiLU-and-mul reads it back.
    rounded = result.to(w_ptr.dtype.element_ty).to(tl.float32)
    gate, up = tl.split(tl.reshape(rounded, (BLOCK_N, 2)))
    output = silu_times_up(gate, up, out_ptr.dtype.element_ty)
    outputs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + outputs, output, mask=outputs < WIDTH)


def gemv_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """One contiguous 16-bit row against a contiguous weight of its dtype, on CUDA."""
    return (
        x.is_cuda
        and x.dim() == 2
        and x.shape[0] == 1
        and x.dtype in (torch.bfloat16, torch.float16)
        and weight.dtype == x.dtype
        and x.stride(1) == 1
        and weight.is_contiguous()
        and weight.shape[1] == x.shape[1]
    )


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """silu(x gate^T) * (x up^T) for x [1, K] and the merged weight [gate; up] [2 * d, K] ->
    [1, d] in x's dtype: the gate-up GEMV and SiLU-and-mul in one launch, the same bits as
    `silu_and_mul(gemv(x, weight))` (gemv_applies(x, weight) must hold)."""
    n, k = weight.shape
    assert n % 2 == 0, "a merged [gate; up] weight has an even number of rows"
    width = n // 2
    out = torch.empty((1, width), dtype=x.dtype, device=x.device)
    launch(
        _gate_up_silu_kernel,
        (triton.cdiv(width, GATED_BLOCK_N),),
        x,
        weight,
        out,
        width,
        k,
        BLOCK_N=GATED_BLOCK_N,
        BLOCK_K=min(MAX_BLOCK_K, triton.next_power_of_2(k)),
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
        **pdl_launch(x.device),
    )
    return out


def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x [1, K] times weight [N, K]^T (+ bias [N]) -> [1, N] in out_dtype (default x's)."""
    n, k = weight.shape
    out = torch.empty((1, n), dtype=out_dtype or x.dtype, device=x.device)
    block_k = min(MAX_BLOCK_K, triton.next_power_of_2(k))
    launch(
        _gemv_kernel,
        (triton.cdiv(n, BLOCK_N),),
        x,
        weight,
        bias if bias is not None else weight,
        out,
        n,
        k,
        HAS_BIAS=bias is not None,
        BLOCK_N=BLOCK_N,
        BLOCK_K=block_k,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
        **pdl_launch(x.device),
    )
    return out
