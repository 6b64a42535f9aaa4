"""The fused MoE experts on the GPU: SiLU-gated expert MLPs of a step's routed tokens in two
GEMM launches (plus the alignment of moe_align.py for grouped tiles), with no host sync, so the
whole layer runs inside a CUDA graph.

    fused_experts(hidden [T, H], topk_weights [T, k], topk_ids [T, k],
                  gate_up [E, 2I, H], down [E, H, I], plan) -> [T, H]

Gate-up (one launch): intermediate[a] = silu(x[t] W_gate[e]^T) * (x[t] W_up[e]^T) for each
    assignment a = t * k + j of token t to expert e = topk_ids[t, j]; both halves accumulate in
    float32 in the same program (the gate rows n and the up rows I + n of the same expert), the
    product is rounded once to the hidden dtype. [T * k, I].
Down (one launch): out[t] = sum_j topk_weights[t, j] * intermediate[t * k + j] W_down[e]^T.
    Grouped tiles add each row's weighted product into a float32 [T, H] with atomics (the
    top-k sum fused; a cast to the hidden dtype follows); rows tiles load a token's k experts'
    rows as one tile and store the sum.

Tile kinds (moe_tiles.py): `rows` reads, per program, one assignment's (or one token's) expert
weights as a matrix-vector product: nothing is sorted, and a batch of one reads exactly its k
chosen experts. Like the dense GEMV (gemv.py) a rows program loads all its weight rows' K tile
at once (gate-up: a feature's gate and up rows; down: a column's rows of all k experts), so
each program has many bytes in flight: decode is bound by how fast these few MB arrive. Rows
launches take part in the decode step's PDL chain (pdl.py). `grouped` takes the sorted, padded
blocks of moe_align.py and runs tensor-core tiles of block_m rows of one expert; blocks of
experts nobody chose do not exist, and the blocks past the step's rows (the grid is sized for
the worst case) exit at once.

fp8 experts (weights float8_e4m3fn): scales per output channel [E, N] or per row and group of
`scale_group` inputs [E, N, G] (a checkpoint's 128x128 blocks, repeated over their rows, as
quant/fp8_block.py keeps them). The weights are widened to the activations' dtype in registers
(weight-only fp8: half the bytes of bf16 read, which is what decode and the MoE's many small
per-expert GEMMs are bound by); per-channel scales scale the accumulator once, group scales each
K step's product (grouped tiles: block_k divides scale_group).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ladle.kernels.moe_align import ExpertBlocks, align_to_expert_blocks
from ladle.kernels.moe_tiles import GROUP_SCALES, ExpertStacks, MoePlan, MoeTile
from ladle.kernels.pdl import allow_next_kernel, pdl_launch, wait_for_previous_kernel


@triton.jit
def _silu_times(gate, up):
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _group_scale_rows(scale_rows, column, SCALE_GROUP: tl.constexpr, mask):
    """One K step's group scales of a tile's weight rows ([BLOCK_N] pointers, stride 1 between
    groups): the step lies in one group."""
    return tl.load(scale_rows + column // SCALE_GROUP, mask=mask, other=0.0)


@triton.jit(do_not_specialize=["num_assignments"])
def _grouped_gate_up_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    num_rows_ptr,
    num_assignments,
    N,
    K,
    stride_x,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_out,
    TOP_K: tl.constexpr,
    SCALES: tl.constexpr,
    SCALE_GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n_blocks = tl.cdiv(N, BLOCK_N)
    num_m_blocks = tl.num_programs(0) // num_n_blocks
    # GROUP_M consecutive row blocks (mostly one expert's) run side by side over the columns,
    # so each weight tile is read from memory once and from L2 by the others.
    programs_per_group = GROUP_M * num_n_blocks
    first_m = (pid // programs_per_group) * GROUP_M
    group_rows = min(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % programs_per_group) % group_rows
    pid_n = (pid % programs_per_group) // group_rows
    if pid_m * BLOCK_M >= tl.load(num_rows_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    assignment = tl.load(sorted_ids_ptr + offs_m)
    is_row = assignment < num_assignments
    token = assignment // TOP_K
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    is_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + token[:, None].to(tl.int64) * stride_x
    w_expert = w_ptr + expert * stride_we
    gate_columns = w_expert + offs_n[None, :].to(tl.int64) * stride_wn
    up_columns = w_expert + (offs_n[None, :] + N).to(tl.int64) * stride_wn
    gate_scales = scale_ptr + expert * stride_se + offs_n * stride_sn
    up_scales = scale_ptr + expert * stride_se + (offs_n + N) * stride_sn
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        cols = start + offs_k
        in_k = cols < K
        x = tl.load(x_rows + cols[None, :], mask=is_row[:, None] & in_k[None, :], other=0.0)
        w_mask = in_k[:, None] & is_n[None, :]
        w_gate = tl.load(gate_columns + cols[:, None], mask=w_mask, other=0.0).to(x.dtype)
        w_up = tl.load(up_columns + cols[:, None], mask=w_mask, other=0.0).to(x.dtype)
        if SCALES == 2:
            scale_gate = _group_scale_rows(gate_scales, start, SCALE_GROUP, is_n)
            scale_up = _group_scale_rows(up_scales, start, SCALE_GROUP, is_n)
            acc_gate += tl.dot(x, w_gate) * scale_gate[None, :]
            acc_up += tl.dot(x, w_up) * scale_up[None, :]
        else:
            acc_gate = tl.dot(x, w_gate, acc_gate)
            acc_up = tl.dot(x, w_up, acc_up)
    if SCALES == 1:
        acc_gate *= tl.load(gate_scales, mask=is_n, other=0.0)[None, :]
        acc_up *= tl.load(up_scales, mask=is_n, other=0.0)[None, :]
    result = _silu_times(acc_gate, acc_up)
    out_rows = out_ptr + assignment[:, None].to(tl.int64) * stride_out
    tl.store(
        out_rows + offs_n[None, :],
        result.to(out_ptr.dtype.element_ty),
        mask=is_row[:, None] & is_n[None, :],
    )


@triton.jit(do_not_specialize=["num_assignments"])
def _grouped_down_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    routing_weights_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    num_rows_ptr,
    num_assignments,
    N,
    K,
    stride_x,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_out,
    TOP_K: tl.constexpr,
    SCALES: tl.constexpr,
    SCALE_GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n_blocks = tl.cdiv(N, BLOCK_N)
    num_m_blocks = tl.num_programs(0) // num_n_blocks
    programs_per_group = GROUP_M * num_n_blocks
    first_m = (pid // programs_per_group) * GROUP_M
    group_rows = min(num_m_blocks - first_m, GROUP_M)
    pid_m = first_m + (pid % programs_per_group) % group_rows
    pid_n = (pid % programs_per_group) // group_rows
    if pid_m * BLOCK_M >= tl.load(num_rows_ptr):
        return
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    assignment = tl.load(sorted_ids_ptr + offs_m)
    is_row = assignment < num_assignments
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    is_n = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + assignment[:, None].to(tl.int64) * stride_x
    w_columns = w_ptr + expert * stride_we + offs_n[None, :].to(tl.int64) * stride_wn
    scales = scale_ptr + expert * stride_se + offs_n * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        cols = start + offs_k
        in_k = cols < K
        x = tl.load(x_rows + cols[None, :], mask=is_row[:, None] & in_k[None, :], other=0.0)
        w = tl.load(w_columns + cols[:, None], mask=in_k[:, None] & is_n[None, :], other=0.0)
        if SCALES == 2:
            scale = _group_scale_rows(scales, start, SCALE_GROUP, is_n)
            acc += tl.dot(x, w.to(x.dtype)) * scale[None, :]
        else:
            acc = tl.dot(x, w.to(x.dtype), acc)
    if SCALES == 1:
        acc *= tl.load(scales, mask=is_n, other=0.0)[None, :]
    routing_weight = tl.load(routing_weights_ptr + assignment, mask=is_row, other=0.0)
    acc *= routing_weight.to(tl.float32)[:, None]
    token = assignment // TOP_K
    tl.atomic_add(
        out_ptr + token[:, None].to(tl.int64) * stride_out + offs_n[None, :],
        acc,
        mask=is_row[:, None] & is_n[None, :],
        sem="relaxed",
    )


@triton.jit
def _sum_rows_over_k(
    x_rows, x_mask, w_rows, w_mask, scale_rows, K, SCALES: tl.constexpr,
    SCALE_GROUP: tl.constexpr, ROWS_A: tl.constexpr, ROWS_B: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """float32 [ROWS_A, ROWS_B]: each weight row (w_rows: pointers to the rows' starts) dotted
    with its input row (x_rows: [ROWS_A, 1] or [1, 1] pointers, broadcast over the rest), all
    rows' BLOCK_K-wide tiles loaded at once; group scales (SCALES == 2; scale_rows point at each
    row's first group, groups 1 apart) applied per element, per-channel ones left to the caller."""
    acc = tl.zeros((ROWS_A, ROWS_B), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        cols = (start + tl.arange(0, BLOCK_K))[None, None, :]
        in_k = cols < K
        x = tl.load(x_rows[:, :, None] + cols, mask=x_mask[:, :, None] & in_k, other=0.0)
        mask = w_mask[:, :, None] & in_k
        # Each weight byte is read once: keep it out of the way of what is reused (x).
        w = tl.load(w_rows[:, :, None] + cols, mask=mask, other=0.0, eviction_policy="evict_first")
        w = w.to(tl.float32)
        if SCALES == 2:
            w *= tl.load(scale_rows[:, :, None] + cols // SCALE_GROUP, mask=mask, other=0.0)
        acc += tl.sum(w * x.to(tl.float32), axis=2)
    return acc


@triton.jit
def _rows_gate_up_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    topk_ids_ptr,
    N,
    K,
    stride_x,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_out,
    TOP_K: tl.constexpr,
    SCALES: tl.constexpr,
    SCALE_GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """BLOCK_N features of one assignment: their gate rows (n) and up rows (N + n) of the
    assignment's expert in one [2, BLOCK_N] tile, so a program keeps twice the bytes in flight
    that one half would."""
    allow_next_kernel(USE_PDL)  # kernels/pdl.py
    pid_n = tl.program_id(0)
    assignment = tl.program_id(1).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    halves = tl.arange(0, 2)[:, None]  # 0: gate, 1: up
    rows = halves * N + offs_n[None, :]
    row_mask = (halves < 2) & (offs_n < N)[None, :]
    # The expert id is the routing kernel's output.
    wait_for_previous_kernel(USE_PDL)
    expert = tl.load(topk_ids_ptr + assignment).to(tl.int64)
    w_rows = w_ptr + expert * stride_we + rows.to(tl.int64) * stride_wn
    scales = scale_ptr + expert * stride_se + rows * stride_sn
    x_row = x_ptr + (assignment // TOP_K) * stride_x + tl.zeros((1, 1), dtype=tl.int64)
    sums = _sum_rows_over_k(x_row, tl.full((1, 1), 1, tl.int1), w_rows, row_mask, scales, K, SCALES,
                            SCALE_GROUP, 2, BLOCK_N, BLOCK_K)  # fmt: skip
    if SCALES == 1:
        sums *= tl.load(scales, mask=row_mask, other=0.0)
    gate = tl.sum(tl.where(halves == 0, sums, 0.0), axis=0)
    up = tl.sum(tl.where(halves == 1, sums, 0.0), axis=0)
    result = _silu_times(gate, up)
    tl.store(out_ptr + assignment * stride_out + offs_n, result.to(out_ptr.dtype.element_ty),
             mask=offs_n < N)  # fmt: skip


@triton.jit
def _rows_down_kernel(
    x_ptr,
    w_ptr,
    scale_ptr,
    out_ptr,
    topk_ids_ptr,
    routing_weights_ptr,
    N,
    K,
    stride_x,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_out,
    TOP_K: tl.constexpr,
    SCALES: tl.constexpr,
    SCALE_GROUP: tl.constexpr,
    SLOTS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    """BLOCK_N output columns of one token: the rows of all its top-k experts in one
    [SLOTS, BLOCK_N] tile (SLOTS: top_k rounded up to a power of two), weighted and summed."""
    allow_next_kernel(USE_PDL)  # kernels/pdl.py
    pid_n = tl.program_id(0)
    token = tl.program_id(1).to(tl.int64)
    slots = tl.arange(0, SLOTS)
    is_slot = slots < TOP_K
    assignments = token * TOP_K + slots
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = is_slot[:, None] & (offs_n < N)[None, :]
    # The expert ids, routing weights and intermediate rows are earlier kernels' outputs.
    wait_for_previous_kernel(USE_PDL)
    experts = tl.load(topk_ids_ptr + assignments, mask=is_slot, other=0).to(tl.int64)
    routing = tl.load(routing_weights_ptr + assignments, mask=is_slot, other=0.0)
    w_rows = w_ptr + experts[:, None] * stride_we + offs_n[None, :].to(tl.int64) * stride_wn
    scales = scale_ptr + experts[:, None] * stride_se + offs_n[None, :] * stride_sn
    x_rows = x_ptr + assignments[:, None] * stride_x
    products = _sum_rows_over_k(x_rows, is_slot[:, None], w_rows, row_mask, scales, K, SCALES,
                                SCALE_GROUP, SLOTS, BLOCK_N, BLOCK_K)  # fmt: skip
    if SCALES == 1:
        products *= tl.load(scales, mask=row_mask, other=0.0)
    total = tl.sum(products * routing.to(tl.float32)[:, None], axis=0)
    tl.store(out_ptr + token * stride_out + offs_n, total.to(out_ptr.dtype.element_ty),
             mask=offs_n < N)  # fmt: skip


def _scale_args(scale: torch.Tensor | None, weight: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(pointer, expert stride, row stride) of a scale tensor; the weight stands in for none."""
    if scale is None:
        return weight, 0, 0
    return scale, scale.stride(0), scale.stride(1)


def _grid_rows_per_block(blocks: ExpertBlocks, num_columns: int, tile: MoeTile) -> tuple[int]:
    return (blocks.max_blocks * triton.cdiv(num_columns, tile.block_n),)


def launch_gate_up(
    hidden: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: ExpertStacks,
    tile: MoeTile,
    blocks: ExpertBlocks | None,
) -> torch.Tensor:
    """The gate-up GEMM with SiLU-and-mul: [T * k, I] in the hidden dtype."""
    num_tokens, top_k = topk_ids.shape
    num_experts, double_intermediate, hidden_size = weights.gate_up.shape
    intermediate_size = double_intermediate // 2
    num_assignments = num_tokens * top_k
    out = torch.empty((num_assignments, intermediate_size), dtype=hidden.dtype,
                      device=hidden.device)  # fmt: skip
    w = weights.gate_up
    scale, stride_se, stride_sn = _scale_args(weights.gate_up_scale, w)
    common = dict(
        TOP_K=top_k,
        SCALES=weights.scale_kind,
        SCALE_GROUP=max(weights.scale_group, 1),
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )
    if tile.kind == "rows":
        grid = (triton.cdiv(intermediate_size, tile.block_n), num_assignments)
        _rows_gate_up_kernel[grid](
            hidden, w, scale, out, topk_ids, intermediate_size, hidden_size, hidden.stride(0),
            w.stride(0), w.stride(1), stride_se, stride_sn, out.stride(0), **common,
            **pdl_launch(hidden.device, num_tokens),
        )  # fmt: skip
        return out
    assert blocks is not None and blocks.block_m == tile.block_m
    _grouped_gate_up_kernel[_grid_rows_per_block(blocks, intermediate_size, tile)](
        hidden, w, scale, out, blocks.sorted_ids, blocks.block_expert, blocks.num_rows,
        num_assignments, intermediate_size, hidden_size, hidden.stride(0), w.stride(0),
        w.stride(1), stride_se, stride_sn, out.stride(0), BLOCK_M=tile.block_m,
        GROUP_M=tile.group_m, **common,
    )  # fmt: skip
    return out


def launch_down(
    intermediate: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: ExpertStacks,
    tile: MoeTile,
    blocks: ExpertBlocks | None,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """The down GEMM, routing weights applied and each token's top-k products summed:
    [T, H] in out_dtype."""
    num_tokens, top_k = topk_ids.shape
    num_experts, hidden_size, intermediate_size = weights.down.shape
    w = weights.down
    scale, stride_se, stride_sn = _scale_args(weights.down_scale, w)
    routing_weights = topk_weights.reshape(-1)
    common = dict(
        TOP_K=top_k,
        SCALES=weights.scale_kind,
        SCALE_GROUP=max(weights.scale_group, 1),
        BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k,
        num_warps=tile.num_warps,
        num_stages=tile.num_stages,
    )
    if tile.kind == "rows":
        out = torch.empty((num_tokens, hidden_size), dtype=out_dtype, device=intermediate.device)
        grid = (triton.cdiv(hidden_size, tile.block_n), num_tokens)
        _rows_down_kernel[grid](
            intermediate, w, scale, out, topk_ids, routing_weights, hidden_size,
            intermediate_size, intermediate.stride(0), w.stride(0), w.stride(1), stride_se,
            stride_sn, out.stride(0), SLOTS=triton.next_power_of_2(top_k), **common,
            **pdl_launch(intermediate.device, num_tokens),
        )  # fmt: skip
        return out
    assert blocks is not None and blocks.block_m == tile.block_m
    summed = torch.zeros((num_tokens, hidden_size), dtype=torch.float32,
                         device=intermediate.device)  # fmt: skip
    _grouped_down_kernel[_grid_rows_per_block(blocks, hidden_size, tile)](
        intermediate, w, scale, summed, routing_weights, blocks.sorted_ids, blocks.block_expert,
        blocks.num_rows, num_tokens * top_k, hidden_size, intermediate_size,
        intermediate.stride(0), w.stride(0), w.stride(1), stride_se, stride_sn, summed.stride(0),
        BLOCK_M=tile.block_m, GROUP_M=tile.group_m, **common,
    )  # fmt: skip
    return summed.to(out_dtype)


def check_plan_fits(plan: MoePlan, weights: ExpertStacks) -> None:
    """ValueError when a grouped tile's K steps straddle the fp8 scale groups."""
    if weights.scale_kind != GROUP_SCALES:
        return
    for tile in (plan.gate_up, plan.down):
        if tile.kind == "grouped" and weights.scale_group % tile.block_k:
            raise ValueError(
                f"grouped tile block_k={tile.block_k} does not divide the fp8 scale group "
                f"{weights.scale_group}"
            )


def fused_experts(
    hidden: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    weights: ExpertStacks,
    plan: MoePlan,
) -> torch.Tensor:
    """The experts' output [T, H] for hidden [T, H] routed by topk_ids / topk_weights [T, k]
    (module docstring). hidden contiguous in rows; topk_* contiguous."""
    if hidden.shape[0] == 0:
        return torch.empty_like(hidden)
    check_plan_fits(plan, weights)
    num_experts = weights.gate_up.shape[0]
    block_m = plan.block_m
    blocks = None
    if block_m is not None:
        with_triton = plan.align == "triton"
        blocks = align_to_expert_blocks(topk_ids, num_experts, block_m, with_triton)
    intermediate = launch_gate_up(hidden, topk_ids, weights, plan.gate_up, blocks)
    return launch_down(
        intermediate, topk_weights, topk_ids, weights, plan.down, blocks, hidden.dtype
    )
