"""The Triton program of the align-block-size step (moe_align.py says what it computes).

One program: count each expert's assignments (a one-hot [CHUNK, experts] per chunk of CHUNK
assignments, summed over rows), then from the padded counts fill the rows with the padding
value and write every block's expert, then place each assignment
at its expert's padded start + the assignments of that expert seen before it (an exclusive
cumulative sum of the one-hot down the chunk keeps them in order, as a stable sort does).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ladle.kernels.expert_blocks import ExpertBlocks

# One-hot elements per chunk: 128 assignments x 128 experts in a program of 8 warps (64 a
# thread), so a 256-token decode step at top-8 takes 16 chunks a pass.
ONE_HOT_ELEMENTS = 16384
NUM_WARPS = 8


@triton.jit(do_not_specialize=["num_assignments", "max_rows"])
def _align_kernel(
    ids_ptr,
    sorted_ids_ptr,
    block_expert_ptr,
    num_rows_ptr,
    num_assignments,
    max_rows,
    NUM_EXPERTS: tl.constexpr,
    EXPERTS_POW2: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr,
    FILL: tl.constexpr = 1024,
):
    experts = tl.arange(0, EXPERTS_POW2)
    counts = tl.zeros([EXPERTS_POW2], dtype=tl.int32)
    for start in range(0, num_assignments, CHUNK):
        offsets = start + tl.arange(0, CHUNK)
        ids = tl.load(ids_ptr + offsets, mask=offsets < num_assignments, other=EXPERTS_POW2)
        one_hot = (ids[:, None] == experts[None, :]).to(tl.int32)
        counts += tl.sum(one_hot, axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    padded_end = tl.cumsum(padded, axis=0)
    padded_start = padded_end - padded
    tl.store(num_rows_ptr, tl.sum(padded, axis=0))
    fill = tl.arange(0, FILL)
    for start in range(0, max_rows, FILL):
        rows = start + fill
        tl.store(sorted_ids_ptr + rows, tl.zeros([FILL], dtype=tl.int32) + num_assignments,
                 mask=rows < max_rows)  # fmt: skip
    # A block's expert is the number of experts whose padded rows all lie before it (clamped
    # for the unused blocks past the last one).
    for start in range(0, max_rows // BLOCK_M, CHUNK):
        blocks = start + tl.arange(0, CHUNK)
        first_rows = blocks * BLOCK_M
        expert = tl.sum((first_rows[:, None] >= padded_end[None, :]).to(tl.int32), axis=1)
        expert = tl.minimum(expert, NUM_EXPERTS - 1)
        tl.store(block_expert_ptr + blocks, expert, mask=first_rows < max_rows)
    # The padding fill above and the placement below may touch the same rows from different
    # threads of the program.
    tl.debug_barrier()
    seen = tl.zeros([EXPERTS_POW2], dtype=tl.int32)
    for start in range(0, num_assignments, CHUNK):
        offsets = start + tl.arange(0, CHUNK)
        is_assignment = offsets < num_assignments
        ids = tl.load(ids_ptr + offsets, mask=is_assignment, other=EXPERTS_POW2)
        one_hot = (ids[:, None] == experts[None, :]).to(tl.int32)
        rank = tl.cumsum(one_hot, axis=0) - one_hot
        position = tl.sum(one_hot * (rank + (padded_start + seen)[None, :]), axis=1)
        tl.store(sorted_ids_ptr + position, offsets.to(tl.int32), mask=is_assignment)
        seen += tl.sum(one_hot, axis=0)


def align_with_triton(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, max_rows: int
) -> ExpertBlocks:
    """ExpertBlocks from the one-program kernel; topk_ids [T, k] of any integer dtype."""
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    device = ids.device
    sorted_ids = torch.empty(max_rows, dtype=torch.int32, device=device)
    block_expert = torch.empty(max_rows // block_m, dtype=torch.int32, device=device)
    num_rows = torch.empty(1, dtype=torch.int32, device=device)
    experts_pow2 = triton.next_power_of_2(num_experts)
    chunk = max(16, ONE_HOT_ELEMENTS // experts_pow2)
    _align_kernel[(1,)](
        ids,
        sorted_ids,
        block_expert,
        num_rows,
        ids.numel(),
        max_rows,
        NUM_EXPERTS=num_experts,
        EXPERTS_POW2=experts_pow2,
        BLOCK_M=block_m,
        CHUNK=chunk,
        num_warps=NUM_WARPS,
    )
    return ExpertBlocks(sorted_ids, block_expert, num_rows, block_m)
