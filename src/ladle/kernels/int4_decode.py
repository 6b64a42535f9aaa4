"""int4 x @ W^T for decode-sized batches: bound by the packed weight's bytes, not by the ALU.

Same layout as kernels/int4_matmul.py: packed_t int32 [ceil(K/8), N] (input k in nibble k % 8 of
word k // 8), scale_t and zero_t float16 [G, N], G = ceil(K / group). Consecutive programs and
lanes read consecutive output columns, so each 8-input row of words is one coalesced read.

Two kernels, each a tile of one quantization group along K per loop trip (both launched through
int4_decode_matmul, which one with which tile is an Int4Kernel):

  gemv        one or two token rows per program, no tensor cores; optionally the next group's
              words, scales and zeros are loaded before this group's arithmetic. A nibble
              becomes a float without an int->float convert (a quarter-rate instruction on
              Hopper that would cap the kernel near half the memory bandwidth): OR-ing it into
              the mantissa of 2^23 gives the float 2^23 + q * 16^j exactly, and one subtraction
              leaves q * 16^j; the activation is pre-scaled by 16^-j. Partial products stay
              elementwise in a [words, columns] accumulator; the one cross-lane reduction
              happens after the loop. Per group, sum_k x_k (q_k - z) s = s (sum_k x_k q_k -
              z sum_k x_k).
  mma         a token tile against a dequantized tile through tl.dot. The codes enter the
              tensor cores as the 16-bit floats M + q (ORed into the mantissa of M = 128 for
              bf16, 1024 for fp16: exact), and the offset folds out after the dot per group:
              x . (M + q) - (M + z) sum(x) = x . (q - z), then times the group's scale.

Split-K without a second launch: each split writes its float32 partial tile, then takes a ticket
from a per-tile counter; the split that arrives last sums the partials in split order (so the
result does not depend on arrival order), writes the output in the activation dtype and resets
the counter to zero for the next launch (kernels/split_counters.py: one buffer per device, only
correct while launches on it are serialized, as on ladle's single compute stream).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ladle.kernels.pdl import allow_next_kernel, pdl_launch, wait_for_previous_kernel
from ladle.kernels.split_counters import (
    COUNTER_CAPACITY,
    arrives_last,
    counter_buffer,
    reset_counter,
)


@triton.jit
def _finish_tile(
    accumulator,
    out_ptr,
    partial_ptr,
    counter_ptr,
    offs_m,
    offs_n,
    mask,
    tile_id,
    pid_split,
    num_splits,
    num_tokens,
    num_columns,
    stride_out,
):
    """Store accumulator [BM, BN] to out, directly or through the last-arriving split."""
    out_offsets = offs_m[:, None].to(tl.int64) * stride_out + offs_n[None, :]
    if num_splits == 1:
        tl.store(out_ptr + out_offsets, accumulator.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tile_offsets = offs_m[:, None].to(tl.int64) * num_columns + offs_n[None, :]
        split_stride = num_tokens.to(tl.int64) * num_columns
        tl.store(partial_ptr + pid_split * split_stride + tile_offsets, accumulator, mask=mask)
        if arrives_last(counter_ptr + tile_id, num_splits):
            total = tl.zeros(accumulator.shape, dtype=tl.float32)
            for split in range(0, num_splits):
                total += tl.load(
                    partial_ptr + split * split_stride + tile_offsets,
                    mask=mask,
                    other=0.0,
                    cache_modifier=".cg",  # from L2: another SM wrote it
                )
            tl.store(out_ptr + out_offsets, total.to(out_ptr.dtype.element_ty), mask=mask)
            reset_counter(counter_ptr + tile_id)


@triton.jit
def _load_group(
    packed_ptr,
    scale_ptr,
    zero_ptr,
    group,
    valid,
    words,
    offs_n,
    is_n,
    num_columns,
    num_inputs,
    GROUP: tl.constexpr,
):
    """One group's packed words [GROUP / 8, BN], scales and zeros [BN] (zeros where not valid)."""
    word_rows = group * (GROUP // 8) + words
    packed = tl.load(
        packed_ptr + word_rows[:, None].to(tl.int64) * num_columns + offs_n[None, :],
        mask=(word_rows[:, None] * 8 < num_inputs) & is_n[None, :] & valid,
        other=0,
    )
    in_range = is_n & (group * GROUP < num_inputs) & valid
    scale = tl.load(scale_ptr + group * num_columns + offs_n, mask=in_range, other=0.0)
    zero = tl.load(zero_ptr + group * num_columns + offs_n, mask=in_range, other=0.0)
    return packed, scale.to(tl.float32), zero.to(tl.float32)


@triton.jit
def _lane_code(packed, high, LANE: tl.constexpr):
    """Nibble LANE of every word as the float q * 16^j (j = LANE for 0..4, LANE - 5 after), made
    by OR-ing the masked bits into the mantissa of 2^23 and subtracting 2^23: exact, and no
    int->float convert. Nibbles 5..7 come from `high` (the words shifted right by 20)."""
    if LANE == 0:
        bits = packed & 0xF
    elif LANE == 1:
        bits = packed & 0xF0
    elif LANE == 2:
        bits = packed & 0xF00
    elif LANE == 3:
        bits = packed & 0xF000
    elif LANE == 4:
        bits = packed & 0xF0000
    elif LANE == 5:
        bits = high & 0xF
    elif LANE == 6:
        bits = high & 0xF0
    else:
        bits = high & 0xF00
    return (bits | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _lane_x(x, LANE: tl.constexpr):
    """x times 16^-j, the inverse of _lane_code's power (exact: a power of two)."""
    if LANE == 0 or LANE == 5:
        scaled = x
    elif LANE == 1 or LANE == 6:
        scaled = x * 0.0625
    elif LANE == 2 or LANE == 7:
        scaled = x * 0.00390625
    elif LANE == 3:
        scaled = x * 0.000244140625
    else:
        scaled = x * 0.0000152587890625
    return scaled


@triton.jit(
    do_not_specialize=["num_tokens", "stride_x", "stride_out", "groups_per_split", "num_splits"]
)
def _int4_gemv_kernel(
    out_ptr,
    partial_ptr,
    counter_ptr,
    x_ptr,
    packed_ptr,
    scale_ptr,
    zero_ptr,
    num_tokens,
    num_columns,
    num_inputs,
    stride_x,
    stride_out,
    groups_per_split,
    num_splits,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    ROWS: tl.constexpr,
    PREFETCH: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """ROWS (1 or 2) token rows per program: each weight is read and turned into a float once
    and multiplied into every row. With PREFETCH the next group's words, scales and zeros are
    loaded before this group's arithmetic, so two groups' reads are in flight per warp (and
    under PDL the first group's before waiting for the kernel that writes x: kernels/pdl.py)."""
    allow_next_kernel(USE_PDL)
    pid_n = tl.program_id(0)
    pid_split = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    is_n = offs_n < num_columns
    words = tl.arange(0, GROUP // 8)
    first_row = pid_m * ROWS
    x_row0 = x_ptr + first_row.to(tl.int64) * stride_x
    has_row1 = first_row + 1 < num_tokens
    acc0 = tl.zeros((GROUP // 8, BLOCK_N), dtype=tl.float32)
    acc1 = tl.zeros((GROUP // 8, BLOCK_N), dtype=tl.float32)
    first_group = pid_split * groups_per_split
    if PREFETCH:
        packed, scale, zero = _load_group(
            packed_ptr,
            scale_ptr,
            zero_ptr,
            first_group,
            groups_per_split > 0,
            words,
            offs_n,
            is_n,
            num_columns,
            num_inputs,
            GROUP,
        )
    wait_for_previous_kernel(USE_PDL)
    for step in range(0, groups_per_split):
        group = first_group + step
        if PREFETCH:
            next_packed, next_scale, next_zero = _load_group(
                packed_ptr,
                scale_ptr,
                zero_ptr,
                group + 1,
                step + 1 < groups_per_split,
                words,
                offs_n,
                is_n,
                num_columns,
                num_inputs,
                GROUP,
            )
        else:
            packed, scale, zero = _load_group(
                packed_ptr,
                scale_ptr,
                zero_ptr,
                group,
                True,
                words,
                offs_n,
                is_n,
                num_columns,
                num_inputs,
                GROUP,
            )
        word_rows = group * (GROUP // 8) + words
        high = packed >> 20  # nibbles 5..7 down to bits 0..11 (the sign bits are masked off)
        sum0 = tl.zeros((GROUP // 8, BLOCK_N), dtype=tl.float32)
        sum1 = tl.zeros((GROUP // 8, BLOCK_N), dtype=tl.float32)
        x_sum0 = tl.zeros((GROUP // 8,), dtype=tl.float32)
        x_sum1 = tl.zeros((GROUP // 8,), dtype=tl.float32)
        for lane in tl.static_range(8):
            k = word_rows * 8 + lane
            in_k = k < num_inputs
            code = _lane_code(packed, high, lane)
            x = tl.load(x_row0 + k, mask=in_k, other=0.0).to(tl.float32)
            x_sum0 += x
            sum0 += code * _lane_x(x, lane)[:, None]
            if ROWS > 1:
                x = tl.load(x_row0 + stride_x + k, mask=in_k & has_row1, other=0.0)
                x = x.to(tl.float32)
                x_sum1 += x
                sum1 += code * _lane_x(x, lane)[:, None]
        acc0 += scale[None, :] * (sum0 - zero[None, :] * x_sum0[:, None])
        if ROWS > 1:
            acc1 += scale[None, :] * (sum1 - zero[None, :] * x_sum1[:, None])
        if PREFETCH:
            packed, scale, zero = next_packed, next_scale, next_zero
    if ROWS == 1:
        offs_m = tl.zeros((1,), dtype=tl.int32) + first_row
        result = tl.sum(acc0, axis=0)[None, :]
    else:
        offs_m = first_row + tl.arange(0, ROWS)
        row_index = tl.arange(0, ROWS)[:, None]
        result = tl.where(row_index == 0, tl.sum(acc0, axis=0)[None, :], 0.0)
        result += tl.where(row_index == 1, tl.sum(acc1, axis=0)[None, :], 0.0)
    _finish_tile(
        result,
        out_ptr,
        partial_ptr,
        counter_ptr,
        offs_m,
        offs_n,
        (offs_m[:, None] < num_tokens) & is_n[None, :],
        pid_m * tl.num_programs(0) + pid_n,
        pid_split,
        num_splits,
        num_tokens,
        num_columns,
        stride_out,
    )


@triton.jit
def _load_group_chunk(
    packed_ptr,
    scale_ptr,
    zero_ptr,
    chunk,
    offs_n,
    is_n,
    num_columns,
    num_inputs,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
):
    """GROUPS quantization groups from group chunk * GROUPS on: packed words [GROUPS, GROUP / 8,
    BN], scales and zeros [GROUPS, BN] (zeros past the last group)."""
    groups = chunk * GROUPS + tl.arange(0, GROUPS)
    word_rows = groups[:, None] * (GROUP // 8) + tl.arange(0, GROUP // 8)[None, :]
    in_rows = word_rows * 8 < num_inputs
    packed = tl.load(
        packed_ptr + word_rows[:, :, None].to(tl.int64) * num_columns + offs_n[None, None, :],
        mask=in_rows[:, :, None] & is_n[None, None, :],
        other=0,
        eviction_policy="evict_first",  # read once a step
    )
    in_groups = (groups[:, None] * GROUP < num_inputs) & is_n[None, :]
    group_offsets = groups[:, None] * num_columns + offs_n[None, :]
    scale = tl.load(scale_ptr + group_offsets, mask=in_groups, other=0.0)
    zero = tl.load(zero_ptr + group_offsets, mask=in_groups, other=0.0)
    return packed, scale.to(tl.float32), zero.to(tl.float32)


@triton.jit
def _int4_row_kernel(
    out_ptr,
    x_ptr,
    packed_ptr,
    scale_ptr,
    zero_ptr,
    num_columns,
    num_inputs,
    num_chunks,
    GROUP: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """One token row, BLOCK_N columns over the whole K per program: no split-K, so no partials,
    tickets or last-arriving reduce (whose serial latency dominated the small projections), and
    the next chunk of GROUPS groups is loaded before this chunk's arithmetic (the first one, under
    PDL, before waiting for the kernel that writes x: kernels/pdl.py)."""
    allow_next_kernel(USE_PDL)
    pid_n = tl.program_id(0)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    is_n = offs_n < num_columns
    words = tl.arange(0, GROUP // 8)
    accumulator = tl.zeros((GROUPS, BLOCK_N), dtype=tl.float32)
    packed, scale, zero = _load_group_chunk(
        packed_ptr,
        scale_ptr,
        zero_ptr,
        0,
        offs_n,
        is_n,
        num_columns,
        num_inputs,
        GROUP,
        GROUPS,
    )
    wait_for_previous_kernel(USE_PDL)
    for chunk in range(0, num_chunks):
        next_packed, next_scale, next_zero = _load_group_chunk(
            packed_ptr,
            scale_ptr,
            zero_ptr,
            chunk + 1,
            offs_n,
            is_n & (chunk + 1 < num_chunks),
            num_columns,
            num_inputs,
            GROUP,
            GROUPS,
        )
        groups = chunk * GROUPS + tl.arange(0, GROUPS)
        word_rows = groups[:, None] * (GROUP // 8) + words[None, :]
        high = packed >> 20  # nibbles 5..7 down to bits 0..11 (the sign bits are masked off)
        sums = tl.zeros((GROUPS, GROUP // 8, BLOCK_N), dtype=tl.float32)
        x_sums = tl.zeros((GROUPS, GROUP // 8), dtype=tl.float32)
        for lane in tl.static_range(8):
            k = word_rows * 8 + lane
            x = tl.load(x_ptr + k, mask=k < num_inputs, other=0.0).to(tl.float32)
            x_sums += x
            sums += _lane_code(packed, high, lane) * _lane_x(x, lane)[:, :, None]
        group_sums = tl.sum(sums, axis=1)
        group_x_sums = tl.sum(x_sums, axis=1)
        accumulator += scale * (group_sums - zero * group_x_sums[:, None])
        packed, scale, zero = next_packed, next_scale, next_zero
    result = tl.sum(accumulator, axis=0)
    tl.store(out_ptr + offs_n, result.to(out_ptr.dtype.element_ty), mask=is_n)


@triton.jit(
    do_not_specialize=["num_tokens", "stride_x", "stride_out", "groups_per_split", "num_splits"]
)
def _int4_mma_kernel(
    out_ptr,
    partial_ptr,
    counter_ptr,
    x_ptr,
    packed_ptr,
    scale_ptr,
    zero_ptr,
    num_tokens,
    num_columns,
    num_inputs,
    stride_x,
    stride_out,
    groups_per_split,
    num_splits,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MAGIC_BITS: tl.constexpr,
    MAGIC_VALUE: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_split = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    is_m = offs_m < num_tokens
    is_n = offs_n < num_columns
    words = tl.arange(0, GROUP // 8)
    shifts = tl.arange(0, 8) * 4
    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    first_group = pid_split * groups_per_split
    for step in range(0, groups_per_split):
        group = first_group + step
        offs_k = group * GROUP + tl.arange(0, GROUP)
        x = tl.load(
            x_ptr + offs_m[:, None].to(tl.int64) * stride_x + offs_k[None, :],
            mask=is_m[:, None] & (offs_k[None, :] < num_inputs),
            other=0.0,
        )
        word_rows = group * (GROUP // 8) + words
        packed = tl.load(
            packed_ptr + word_rows[:, None].to(tl.int64) * num_columns + offs_n[None, :],
            mask=(word_rows[:, None] * 8 < num_inputs) & is_n[None, :],
            other=0,
        )
        codes = (packed[:, None, :] >> shifts[None, :, None]) & 0xF
        codes = tl.reshape(codes, (GROUP, BLOCK_N))
        weight = (codes | MAGIC_BITS).to(tl.int16).to(x.dtype, bitcast=True)
        product = tl.dot(x, weight)
        x_sum = tl.sum(x.to(tl.float32), axis=1)
        in_range = is_n & (group * GROUP < num_inputs)
        scale = tl.load(scale_ptr + group * num_columns + offs_n, mask=in_range, other=0.0)
        zero = tl.load(zero_ptr + group * num_columns + offs_n, mask=in_range, other=0.0)
        offset = zero.to(tl.float32) + MAGIC_VALUE
        accumulator += (product - x_sum[:, None] * offset[None, :]) * scale.to(tl.float32)[None, :]
    _finish_tile(
        accumulator,
        out_ptr,
        partial_ptr,
        counter_ptr,
        offs_m,
        offs_n,
        is_m[:, None] & is_n[None, :],
        pid_m * tl.num_programs(0) + pid_n,
        pid_split,
        num_splits,
        num_tokens,
        num_columns,
        stride_out,
    )


@dataclass(frozen=True)
class Int4Kernel:
    """One launch configuration: which kernel, its column tile, warps, how many programs the
    split-K plan aims for (the number of splits follows from the shape) and, for the GEMV, the
    token rows per program and whether it prefetches the next group."""

    kind: str  # "gemv", "row" (one token row, whole K per program) or "mma"
    block_n: int
    num_warps: int
    target_programs: int = 0  # split-K kernels only
    rows: int = 1
    prefetch: bool = False
    groups: int = 0  # "row": quantization groups per loop trip

    def suits(self, num_tokens: int) -> bool:
        """Whether this kernel can take a call of num_tokens rows ("row" takes exactly one)."""
        return num_tokens == 1 if self.kind == "row" else self.rows <= num_tokens

    def __str__(self) -> str:
        if self.kind == "row":
            return f"row/n{self.block_n}/w{self.num_warps}/g{self.groups}"
        extra = (
            f"/r{self.rows}{'/prefetch' if self.prefetch else ''}" if self.kind == "gemv" else ""
        )
        return f"{self.kind}/n{self.block_n}/w{self.num_warps}/p{self.target_programs}{extra}"


# The candidates timed per weight shape and batch bucket at load (quant/int4_plan.py); few
# distinct compile-time configurations, because each one is a Triton build at start-up.
GEMV_KERNELS = (
    Int4Kernel("gemv", 128, 4, 528),
    Int4Kernel("gemv", 128, 4, 1056),
    Int4Kernel("gemv", 64, 2, 1056, prefetch=True),
    Int4Kernel("gemv", 128, 4, 264, rows=2, prefetch=True),
    # One row only; the best two of scripts/int4_gemv_sweep.py on the 8B's shapes read from HBM
    # (gate_up 39.3 -> 35.8 us, qkv 13.1 -> 12.8, o 10.7 -> 10.4 against the split-K GEMV).
    Int4Kernel("row", 16, 2, groups=4),
    Int4Kernel("row", 32, 4, groups=8),
)
MMA_KERNELS = (Int4Kernel("mma", 128, 8, 264),)
# Without a plan (a layer finalized off the GPU, direct calls): the defaults per batch size.
DEFAULT_GEMV = GEMV_KERNELS[0]
DEFAULT_MMA = MMA_KERNELS[0]
GEMV_MAX_TOKENS = 16


def _block_m(num_tokens: int) -> int:
    return 16 if num_tokens <= 16 else (32 if num_tokens <= 32 else 64)


def _check(x: torch.Tensor, packed_t, scale_t, zero_t, group_size: int) -> None:
    if group_size % 8 or group_size & (group_size - 1) or not 16 <= group_size <= 256:
        raise ValueError(f"int4 group size must be a power of two in 16..256, not {group_size}")
    if x.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"int4 matmul takes bfloat16 or float16 activations, not {x.dtype}")
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"int4 matmul input must be 2-D with contiguous rows, not {x.shape}")
    num_inputs = x.shape[1]
    if packed_t.shape[0] * 8 < num_inputs or packed_t.dtype != torch.int32:
        raise ValueError(
            f"int4 packed weight {tuple(packed_t.shape)} {packed_t.dtype} does not hold "
            f"{num_inputs} inputs as int32 words of 8 nibbles"
        )
    expected = (-(-num_inputs // group_size), packed_t.shape[1])
    if tuple(scale_t.shape) != expected or tuple(zero_t.shape) != expected:
        raise ValueError(
            f"int4 scales {tuple(scale_t.shape)} / zeros {tuple(zero_t.shape)} must both be "
            f"{expected} for {num_inputs} inputs in groups of {group_size}"
        )


def int4_decode_matmul(
    x: torch.Tensor,
    packed_t: torch.Tensor,
    scale_t: torch.Tensor,
    zero_t: torch.Tensor,
    group_size: int,
    kernel: Int4Kernel | None = None,
) -> torch.Tensor:
    """x [M, K] (CUDA, bf16/fp16, rows contiguous) @ W^T -> [M, N] in x's dtype, one launch."""
    _check(x, packed_t, scale_t, zero_t, group_size)
    num_tokens, num_inputs = x.shape
    num_columns = packed_t.shape[1]
    if kernel is None:
        kernel = DEFAULT_GEMV if num_tokens <= GEMV_MAX_TOKENS else DEFAULT_MMA
    out = torch.empty(num_tokens, num_columns, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    pdl = pdl_launch(x.device, num_tokens)  # the GEMVs only (the mma kernel goes without)
    if kernel.kind == "row":
        if num_tokens != 1:
            raise ValueError(f"int4 kernel {kernel} takes one token row, not {num_tokens}")
        num_groups = scale_t.shape[0]
        _int4_row_kernel[(triton.cdiv(num_columns, kernel.block_n),)](
            out,
            x,
            packed_t,
            scale_t,
            zero_t,
            num_columns,
            num_inputs,
            triton.cdiv(num_groups, kernel.groups),
            GROUP=group_size,
            GROUPS=kernel.groups,
            BLOCK_N=kernel.block_n,
            num_warps=kernel.num_warps,
            **pdl,
        )
        return out
    block_m = _block_m(num_tokens)
    num_blocks_n = triton.cdiv(num_columns, kernel.block_n)
    rows = triton.cdiv(num_tokens, kernel.rows if kernel.kind == "gemv" else block_m)
    num_groups = scale_t.shape[0]
    num_splits = max(1, min(num_groups, kernel.target_programs // (num_blocks_n * rows)))
    groups_per_split = triton.cdiv(num_groups, num_splits)
    num_splits = triton.cdiv(num_groups, groups_per_split)
    counters = counter_buffer(x.device)
    if rows * num_blocks_n > COUNTER_CAPACITY:
        num_splits, groups_per_split = 1, num_groups
    # Unsplit launches never touch the partials; one float32 element keeps the signature (and
    # so the compiled kernel) the same.
    partial_shape = (num_splits, num_tokens, num_columns) if num_splits > 1 else (1,)
    partial = torch.empty(partial_shape, dtype=torch.float32, device=x.device)
    grid = (num_blocks_n, num_splits, rows)
    common = (
        out,
        partial,
        counters,
        x,
        packed_t,
        scale_t,
        zero_t,
        num_tokens,
        num_columns,
        num_inputs,
        x.stride(0),
        out.stride(0),
        groups_per_split,
        num_splits,
    )
    if kernel.kind == "gemv":
        _int4_gemv_kernel[grid](
            *common,
            GROUP=group_size,
            BLOCK_N=kernel.block_n,
            ROWS=kernel.rows,
            PREFETCH=kernel.prefetch,
            num_warps=kernel.num_warps,
            **pdl,
        )
    else:
        bf16 = x.dtype == torch.bfloat16
        _int4_mma_kernel[grid](
            *common,
            GROUP=group_size,
            BLOCK_M=block_m,
            BLOCK_N=kernel.block_n,
            MAGIC_BITS=0x4300 if bf16 else 0x6400,
            MAGIC_VALUE=128.0 if bf16 else 1024.0,
            num_warps=kernel.num_warps,
            num_stages=3,
        )
    return out
