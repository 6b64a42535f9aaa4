"""x @ W^T with W in int4 (group-wise scales and zeros), dequantized inside the GEMM.

Decode is bound by the bytes of weight read per step; int4 reads a quarter of bf16's. Each
program owns BLOCK_N output columns and a slice of K (split-K, so that a 4096-wide output still
fills every SM at batch 1): it loads BLOCK_K / 8 packed words per column, unpacks the eight
nibbles of each word with shifts, applies its group's scale and zero in float32, rounds to the
activation dtype and feeds tl.dot. Split-K partial sums land in a float32 buffer that one sum
reduces (deterministic, unlike atomics).

Layout (model/layers/quant/int4.py): packed_t int32 [ceil(K/8), N] with input k in nibble k % 8
of word k // 8; scale_t float16 [G, N]; zero_t float16 [G, N]; G = ceil(K / group_size).
The torch reference is int4_matmul_reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NUM_SMS_TARGET = 264  # two waves of programs on a 132-SM H100


@triton.jit
def _int4_matmul_kernel(
    partial_ptr,
    x_ptr,
    packed_ptr,
    scale_ptr,
    zero_ptr,
    num_tokens,
    num_columns,
    num_inputs,
    stride_x,
    stride_partial_split,
    TILES_PER_SPLIT: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_split = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    is_m = offs_m < num_tokens
    is_n = offs_n < num_columns
    words = tl.arange(0, BLOCK_K // 8)
    shifts = tl.arange(0, 8) * 4
    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_begin = pid_split * TILES_PER_SPLIT * BLOCK_K
    # A fixed trip count (the last split's tiles past K load masked zeros): the loop bounds stay
    # compile-time, which the Triton interpreter (CPU tests) needs too.
    for tile in range(0, TILES_PER_SPLIT):
        k0 = k_begin + tile * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + offs_m[:, None].to(tl.int64) * stride_x + offs_k[None, :],
            mask=is_m[:, None] & (offs_k[None, :] < num_inputs),
            other=0.0,
        )
        word_rows = k0 // 8 + words
        packed = tl.load(
            packed_ptr + word_rows[:, None].to(tl.int64) * num_columns + offs_n[None, :],
            mask=(word_rows[:, None] * 8 < num_inputs) & is_n[None, :],
            other=0,
        )
        codes = (packed[:, None, :] >> shifts[None, :, None]) & 0xF
        codes = tl.reshape(codes, (BLOCK_K, BLOCK_N))
        group = k0 // GROUP
        scale = tl.load(scale_ptr + group * num_columns + offs_n, mask=is_n, other=0.0)
        zero = tl.load(zero_ptr + group * num_columns + offs_n, mask=is_n, other=0.0)
        weight = (codes.to(tl.float32) - zero.to(tl.float32)[None, :]) * scale.to(tl.float32)[
            None, :
        ]
        accumulator = tl.dot(x, weight.to(x.dtype), accumulator)
    tl.store(
        partial_ptr
        + pid_split * stride_partial_split
        + offs_m[:, None].to(tl.int64) * num_columns
        + offs_n[None, :],
        accumulator,
        mask=is_m[:, None] & is_n[None, :],
    )


def int4_matmul(
    x: torch.Tensor,
    packed_t: torch.Tensor,
    scale_t: torch.Tensor,
    zero_t: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """x [M, K] (CUDA, bf16/fp16, row-contiguous) @ W^T -> [M, N] in x's dtype."""
    num_tokens, num_inputs = x.shape
    num_columns = packed_t.shape[1]
    if packed_t.shape[0] * 8 < num_inputs or scale_t.shape != zero_t.shape:
        raise ValueError(
            f"int4 weight {tuple(packed_t.shape)} / scales {tuple(scale_t.shape)} / zeros "
            f"{tuple(zero_t.shape)} do not fit an input of width {num_inputs}"
        )
    block_k = min(group_size, 128)
    if group_size % block_k:
        raise ValueError(f"group size {group_size} is not a multiple of {block_k}")
    block_m = 16 if num_tokens <= 16 else (32 if num_tokens <= 32 else 64)
    block_n = 64
    num_blocks_n = triton.cdiv(num_columns, block_n)
    num_blocks_k = triton.cdiv(num_inputs, block_k)
    num_splits = max(1, min(num_blocks_k, NUM_SMS_TARGET // num_blocks_n))
    blocks_per_split = triton.cdiv(num_blocks_k, num_splits)
    num_splits = triton.cdiv(num_blocks_k, blocks_per_split)
    partial = torch.empty(num_splits, num_tokens, num_columns, dtype=torch.float32, device=x.device)
    grid = (num_blocks_n, num_splits, triton.cdiv(num_tokens, block_m))
    _int4_matmul_kernel[grid](
        partial,
        x,
        packed_t,
        scale_t,
        zero_t,
        num_tokens,
        num_columns,
        num_inputs,
        x.stride(0),
        partial.stride(0),
        TILES_PER_SPLIT=blocks_per_split,
        GROUP=group_size,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=4,
        num_stages=3,
    )
    if num_splits == 1:
        return partial[0].to(x.dtype)
    return partial.sum(dim=0).to(x.dtype)


@triton.jit
def _int4_dequantize_kernel(
    weight_ptr,
    packed_ptr,
    scale_ptr,
    zero_ptr,
    num_columns,
    num_inputs,
    GROUP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    k0 = tl.program_id(0) * BLOCK_K
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    is_n = offs_n < num_columns
    word_rows = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    packed = tl.load(
        packed_ptr + word_rows[:, None].to(tl.int64) * num_columns + offs_n[None, :],
        mask=(word_rows[:, None] * 8 < num_inputs) & is_n[None, :],
        other=0,
    )
    shifts = tl.arange(0, 8) * 4
    codes = tl.reshape((packed[:, None, :] >> shifts[None, :, None]) & 0xF, (BLOCK_K, BLOCK_N))
    group = k0 // GROUP
    scale = tl.load(scale_ptr + group * num_columns + offs_n, mask=is_n, other=0.0)
    zero = tl.load(zero_ptr + group * num_columns + offs_n, mask=is_n, other=0.0)
    weight = (codes.to(tl.float32) - zero.to(tl.float32)[None, :]) * scale.to(tl.float32)[None, :]
    offs_k = k0 + tl.arange(0, BLOCK_K)
    tl.store(
        weight_ptr + offs_k[:, None].to(tl.int64) * num_columns + offs_n[None, :],
        weight.to(weight_ptr.dtype.element_ty),
        mask=(offs_k[:, None] < num_inputs) & is_n[None, :],
    )


def int4_dequantize(
    packed_t: torch.Tensor,
    scale_t: torch.Tensor,
    zero_t: torch.Tensor,
    group_size: int,
    num_inputs: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The dense W^T [K, N] in `dtype`, one launch: the prefill path, where the GEMM is
    compute-bound and cuBLAS on the dense weight beats dequantizing inside a Triton GEMM."""
    num_columns = packed_t.shape[1]
    weight_t = torch.empty(num_inputs, num_columns, dtype=dtype, device=packed_t.device)
    block_k = min(group_size, 128)
    block_n = 128
    grid = (triton.cdiv(num_inputs, block_k), triton.cdiv(num_columns, block_n))
    _int4_dequantize_kernel[grid](
        weight_t,
        packed_t,
        scale_t,
        zero_t,
        num_columns,
        num_inputs,
        GROUP=group_size,
        BLOCK_K=block_k,
        BLOCK_N=block_n,
        num_warps=4,
    )
    return weight_t


@triton.jit
def _int4_gemv_kernel(
    partial_ptr,
    x_ptr,
    packed_ptr,
    scale_ptr,
    zero_ptr,
    num_columns,
    num_inputs,
    stride_x,
    stride_partial_split,
    TILES_PER_SPLIT: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One token row per program column: no tl.dot (a batch of 1 would fill 1/16 of an MMA) and
    no unpack-to-tile reshape. Per group, sum_k x_k (q_k - z) s = s (sum_k x_k q_k - z sum_k x_k),
    so each weight costs a shift, a mask, a convert and a multiply-add."""
    pid_n = tl.program_id(0)
    pid_split = tl.program_id(1)
    row = tl.program_id(2).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    is_n = offs_n < num_columns
    words = tl.arange(0, BLOCK_K // 8)
    lanes = tl.arange(0, 8)
    accumulator = tl.zeros((BLOCK_N,), dtype=tl.float32)
    k_begin = pid_split * TILES_PER_SPLIT * BLOCK_K
    for tile in range(0, TILES_PER_SPLIT):
        k0 = k_begin + tile * BLOCK_K
        word_rows = k0 // 8 + words
        packed = tl.load(
            packed_ptr + word_rows[:, None].to(tl.int64) * num_columns + offs_n[None, :],
            mask=(word_rows[:, None] * 8 < num_inputs) & is_n[None, :],
            other=0,
        )
        offs_k = word_rows[:, None] * 8 + lanes[None, :]
        x = tl.load(x_ptr + row * stride_x + offs_k, mask=offs_k < num_inputs, other=0.0)
        x = x.to(tl.float32)
        codes = (packed[:, None, :] >> (lanes * 4)[None, :, None]) & 0xF
        weighted = tl.sum(tl.sum(codes.to(tl.float32) * x[:, :, None], axis=0), axis=0)
        x_sum = tl.sum(tl.sum(x, axis=1), axis=0)
        group = k0 // GROUP
        scale = tl.load(scale_ptr + group * num_columns + offs_n, mask=is_n, other=0.0)
        zero = tl.load(zero_ptr + group * num_columns + offs_n, mask=is_n, other=0.0)
        accumulator += scale.to(tl.float32) * (weighted - zero.to(tl.float32) * x_sum)
    tl.store(
        partial_ptr + pid_split * stride_partial_split + row * num_columns + offs_n,
        accumulator,
        mask=is_n,
    )


def int4_gemv(
    x: torch.Tensor,
    packed_t: torch.Tensor,
    scale_t: torch.Tensor,
    zero_t: torch.Tensor,
    group_size: int,
    block_n: int = 128,
) -> torch.Tensor:
    """int4_matmul for a few rows (decode at batch 1), without tensor cores; same layout."""
    num_tokens, num_inputs = x.shape
    num_columns = packed_t.shape[1]
    block_k = min(group_size, 128)
    num_blocks_n = triton.cdiv(num_columns, block_n)
    num_blocks_k = triton.cdiv(num_inputs, block_k)
    num_splits = max(1, min(num_blocks_k, 4 * NUM_SMS_TARGET // num_blocks_n))
    blocks_per_split = triton.cdiv(num_blocks_k, num_splits)
    num_splits = triton.cdiv(num_blocks_k, blocks_per_split)
    partial = torch.empty(num_splits, num_tokens, num_columns, dtype=torch.float32, device=x.device)
    _int4_gemv_kernel[(num_blocks_n, num_splits, num_tokens)](
        partial,
        x,
        packed_t,
        scale_t,
        zero_t,
        num_columns,
        num_inputs,
        x.stride(0),
        partial.stride(0),
        TILES_PER_SPLIT=blocks_per_split,
        GROUP=group_size,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=4,
    )
    if num_splits == 1:
        return partial[0].to(x.dtype)
    return partial.sum(dim=0).to(x.dtype)


_gemv_choice: dict[tuple, bool] = {}


def prefers_gemv(
    packed_t: torch.Tensor, scale_t: torch.Tensor, zero_t: torch.Tensor, group_size: int
) -> bool:
    """Whether int4_gemv beats int4_matmul at batch 1 for this weight shape on this GPU, measured
    once per shape at load (outside graph capture) with CUDA events, after checking the two
    agree. Any failure (a compile error, a mismatch) keeps int4_matmul."""
    key = (tuple(packed_t.shape), group_size, packed_t.device)
    if key in _gemv_choice:
        return _gemv_choice[key]
    _gemv_choice[key] = False
    try:
        num_inputs = packed_t.shape[0] * 8
        generator = torch.Generator(device=packed_t.device).manual_seed(0)  # not the global RNG
        x = torch.randn(1, num_inputs, device=packed_t.device, generator=generator)
        x = x.to(torch.bfloat16)
        args = (packed_t, scale_t, zero_t, group_size)
        expected = int4_matmul(x, *args).float()
        actual = int4_gemv(x, *args).float()
        error = (actual - expected).norm() / expected.norm().clamp_min(1e-30)
        if not bool(error < 1e-2):
            return False
        timings = {}
        for name, kernel in (("matmul", int4_matmul), ("gemv", int4_gemv)):
            for _ in range(3):
                kernel(x, *args)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                kernel(x, *args)
            end.record()
            end.synchronize()
            timings[name] = start.elapsed_time(end)
        _gemv_choice[key] = timings["gemv"] < timings["matmul"]
    except Exception:  # noqa: BLE001 - any failure means: keep the tested kernel
        _gemv_choice[key] = False
    return _gemv_choice[key]


def int4_matmul_reference(
    x: torch.Tensor,
    packed_t: torch.Tensor,
    scale_t: torch.Tensor,
    zero_t: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """The same product in float32 torch, the weight dequantized and rounded to x's dtype."""
    num_inputs = x.shape[1]
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=x.device)
    codes = ((packed_t[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(-1, packed_t.shape[1])
    codes = codes[:num_inputs].float()
    scale = scale_t.float().repeat_interleave(group_size, dim=0)[:num_inputs]
    zero = zero_t.float().repeat_interleave(group_size, dim=0)[:num_inputs]
    weight = ((codes - zero) * scale).to(x.dtype).float()
    return (x.float() @ weight).to(x.dtype)
