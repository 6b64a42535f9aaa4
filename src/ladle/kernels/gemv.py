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

from ladle.kernels.activation import gate_up_rows, store_silu_of_pairs
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
def _normalized_row(
    x, residual_ptr, gamma, new_residual_ptr, cols, col_mask, K, eps, HAS_RESIDUAL: tl.constexpr
):
    """What rms_norm returns for the row x (all K columns in this one tile), in float32, with
    kernels/rms_norm.py's roundings: the residual sum rounded to x's dtype (with a residual; the
    first program also stores it, the new residual stream, into new_residual, a buffer no
    program reads), normalised and rounded, times the norm weight gamma and rounded. Only the
    variance's summation order differs from that kernel's."""
    dtype = x.dtype
    s = x.to(tl.float32)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        s = (s + residual).to(dtype)
        tl.store(new_residual_ptr + cols, s, mask=col_mask & (tl.program_id(0) == 0))
        s = s.to(tl.float32)
    inverse_rms = tl.rsqrt(tl.sum(s * s, axis=0) / K + eps)
    normalized = (s * inverse_rms).to(dtype).to(tl.float32)
    return (normalized * gamma.to(tl.float32)).to(dtype).to(tl.float32)


@triton.jit
def _dot_rows(
    x_ptr,
    w_ptr,
    rows,
    row_mask,
    K,
    residual_ptr,
    norm_ptr,
    new_residual_ptr,
    eps,
    BLOCK_K: tl.constexpr,
    NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The float32 dot products of weight rows `rows` (any row indices) with the row x, or with
    the RMSNorm of x (+ residual) when NORM (the norm's launch folded into this one; K must then
    fit one BLOCK_K tile)."""
    # The first weight tile (and the norm weight) is loaded before waiting for the kernel that
    # writes x (under PDL, kernels/pdl.py: it may still be running), the rest in the loop.
    cols = tl.arange(0, BLOCK_K)
    col_mask = cols < K
    w = _load_weight_tile(w_ptr, rows, row_mask, cols, col_mask, K)
    if NORM:
        gamma = tl.load(norm_ptr + cols, mask=col_mask, other=0.0)
    wait_for_previous_kernel(USE_PDL)
    x = tl.load(x_ptr + cols, mask=col_mask, other=0.0)
    if NORM:
        x = _normalized_row(
            x, residual_ptr, gamma, new_residual_ptr, cols, col_mask, K, eps, HAS_RESIDUAL
        )
    acc = w.to(tl.float32) * x.to(tl.float32)[None, :]
    for start in range(BLOCK_K, K, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_mask = cols < K
        x_tile = tl.load(x_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        w = _load_weight_tile(w_ptr, rows, row_mask, cols, col_mask, K)
        acc += w.to(tl.float32) * x_tile[None, :]
    return tl.sum(acc, axis=1)


@triton.jit
def _gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    N,
    K,
    residual_ptr,
    norm_ptr,
    new_residual_ptr,
    eps,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    allow_next_kernel(USE_PDL)  # kernels/pdl.py
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    result = _dot_rows(
        x_ptr,
        w_ptr,
        rows,
        row_mask,
        K,
        residual_ptr,
        norm_ptr,
        new_residual_ptr,
        eps,
        BLOCK_K,
        NORM,
        HAS_RESIDUAL,
        USE_PDL,
    )
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
    residual_ptr,
    norm_ptr,
    new_residual_ptr,
    eps,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NORM: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """silu(gate) * up for BLOCK_N features: the program reads their gate rows (w[j]) and up
    rows (w[WIDTH + j]) interleaved in one tile, then pairs the two halves of the result."""
    allow_next_kernel(USE_PDL)  # kernels/pdl.py
    rows, is_feature = gate_up_rows(WIDTH, BLOCK_N)
    result = _dot_rows(
        x_ptr,
        w_ptr,
        rows,
        is_feature,
        K,
        residual_ptr,
        norm_ptr,
        new_residual_ptr,
        eps,
        BLOCK_K,
        NORM,
        HAS_RESIDUAL,
        USE_PDL,
    )
    # The weight's dtype is the output's (gemv_applies).
    store_silu_of_pairs(out_ptr, result, WIDTH, BLOCK_N)


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


def norm_prologue_applies(
    x: torch.Tensor, norm_weight: torch.Tensor, residual: torch.Tensor | None
) -> bool:
    """Whether the GEMV can apply this RMSNorm (and residual add) to its row first: a row that
    fits one K tile (the norm needs all of it before the first product), a norm weight and
    residual of the row's dtype and size, contiguous."""
    fits = x.shape[1] <= MAX_BLOCK_K
    fits = fits and norm_weight.dtype == x.dtype and norm_weight.shape == (x.shape[1],)
    fits = fits and norm_weight.is_contiguous()
    if residual is not None:
        fits = fits and residual.shape == x.shape and residual.dtype == x.dtype
        fits = fits and residual.is_contiguous()
    return fits


def _norm_arguments(
    x: torch.Tensor,
    norm_weight: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None,
    new_residual: torch.Tensor | None,
) -> tuple[tuple, dict[str, bool]]:
    """The kernels' norm operands (x stands in for the unused ones) and their constexprs."""
    if norm_weight is None:
        return (x, x, x, 0.0), {"NORM": False, "HAS_RESIDUAL": False}
    if x.shape[1] > MAX_BLOCK_K:
        raise ValueError(f"the GEMV's norm prologue takes rows up to {MAX_BLOCK_K} wide")
    if residual is not None and (new_residual is None or new_residual.data_ptr() in (
        residual.data_ptr(),
        x.data_ptr(),
    )):
        # Every program reads x and the residual while the first writes the sum: into a
        # buffer that no program reads, never in place.
        raise ValueError("the GEMV's norm prologue needs a separate new_residual buffer")
    has_residual = residual is not None
    operands = (
        residual if has_residual else x,
        norm_weight,
        new_residual if has_residual else x,
        eps,
    )
    return operands, {"NORM": True, "HAS_RESIDUAL": has_residual}


def gate_up_silu(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    new_residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """silu(x gate^T) * (x up^T) for x [1, K] and the merged weight [gate; up] [2 * d, K] ->
    [1, d] in x's dtype: the gate-up GEMV and SiLU-and-mul in one launch, the same bits as
    `silu_and_mul(gemv(x, weight))` (gemv_applies(x, weight) must hold). With norm_weight the
    row is first RMSNorm(x (+ residual)) as in gemv."""
    n, k = weight.shape
    assert n % 2 == 0, "a merged [gate; up] weight has an even number of rows"
    width = n // 2
    out = torch.empty((1, width), dtype=x.dtype, device=x.device)
    norm_operands, norm_flags = _norm_arguments(x, norm_weight, eps, residual, new_residual)
    launch(
        _gate_up_silu_kernel,
        (triton.cdiv(width, GATED_BLOCK_N),),
        x,
        weight,
        out,
        width,
        k,
        *norm_operands,
        BLOCK_N=GATED_BLOCK_N,
        BLOCK_K=min(MAX_BLOCK_K, triton.next_power_of_2(k)),
        **norm_flags,
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
    *,
    norm_weight: torch.Tensor | None = None,
    eps: float = 0.0,
    residual: torch.Tensor | None = None,
    new_residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [1, K] times weight [N, K]^T (+ bias [N]) -> [1, N] in out_dtype (default x's).

    With norm_weight, the row multiplied is RMSNorm(x + residual) (residual optional), as
    kernels/rms_norm.py would return it: the norm's launch folded into this one (a batch-1
    decode step is a chain of launches a few microseconds each). The sum x + residual, the next
    residual stream, is written into new_residual (a separate buffer: every program reads
    residual while one writes). norm_prologue_applies() says when the operands fit."""
    n, k = weight.shape
    out = torch.empty((1, n), dtype=out_dtype or x.dtype, device=x.device)
    block_k = min(MAX_BLOCK_K, triton.next_power_of_2(k))
    norm_operands, norm_flags = _norm_arguments(x, norm_weight, eps, residual, new_residual)
    launch(
        _gemv_kernel,
        (triton.cdiv(n, BLOCK_N),),
        x,
        weight,
        bias if bias is not None else weight,
        out,
        n,
        k,
        *norm_operands,
        HAS_BIAS=bias is not None,
        BLOCK_N=BLOCK_N,
        BLOCK_K=block_k,
        **norm_flags,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
        **pdl_launch(x.device),
    )
    return out
