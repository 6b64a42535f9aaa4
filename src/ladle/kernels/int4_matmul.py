"""The int4 weight (group-wise scales and zeros) dequantized whole, and the torch reference.

Layout (model/layers/quant/int4.py): packed_t int32 [ceil(K/8), N] with input k in nibble k % 8
of word k // 8; scale_t float16 [G, N]; zero_t float16 [G, N]; G = ceil(K / group_size).
int4_dequantize is the prefill path (one launch writes the dense W^T, then cuBLAS, which beats
any dequantize-in-the-GEMM kernel once the GEMM is compute-bound); decode-sized batches use
kernels/int4_decode.py. int4_matmul_reference is the product both are tested against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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


def int4_matmul_reference(
    x: torch.Tensor,
    packed_t: torch.Tensor,
    scale_t: torch.Tensor,
    zero_t: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """The exact product in float32: x @ ((q - z) s) with nothing rounded to x's dtype, neither
    the weight nor the result (the decode kernels keep (q - z) s exact and round only their
    float32 output; the prefill path also rounds the weight, so it is compared more loosely)."""
    num_inputs = x.shape[1]
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=x.device)
    codes = ((packed_t[:, None, :] >> shifts[None, :, None]) & 0xF).reshape(-1, packed_t.shape[1])
    codes = codes[:num_inputs].float()
    scale = scale_t.float().repeat_interleave(group_size, dim=0)[:num_inputs]
    zero = zero_t.float().repeat_interleave(group_size, dim=0)[:num_inputs]
    return x.float() @ ((codes - zero) * scale)
