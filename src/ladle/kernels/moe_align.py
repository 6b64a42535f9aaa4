"""The align-block-size step of the fused MoE path: sort a step's (token, expert) assignments by
expert and pad each expert's run to a whole number of BLOCK_M rows, so a grouped GEMM program
takes one block of rows that all belong to one expert and reads only that expert's weights.

    topk_ids [T, k] -> ExpertBlocks
        sorted_ids   int32 [max_rows]  assignment a = token * k + slot per row, padding rows hold
                                        num_assignments (T * k), which the kernels mask out
        block_expert int32 [max_blocks] the expert of each block of BLOCK_M rows
        num_rows     int32 [1]          rows in use (a multiple of BLOCK_M); blocks past it exit

Everything is sized from T, k, the number of experts and BLOCK_M alone (never from the counts),
and nothing is read back on the host, so the step runs inside a CUDA graph. At most
min(num_experts, T * k) experts get rows, each wastes under BLOCK_M rows of padding:
max_rows = T * k + min(num_experts, T * k) * (BLOCK_M - 1), rounded up to a block.

Two implementations, the same output (assignments of one expert keep their order, as a stable
sort by expert gives): one Triton program for decode-sized steps (one launch instead of about a
dozen torch ops), and torch ops (a sort and a few scatters over the whole GPU) for larger ones,
where one program looping over every assignment becomes the slow part. Where the two cross is
measured at start-up with the tiles (kernels/moe_tuning.py): a plan names its alignment.
"""

from __future__ import annotations

import torch

from ladle.kernels.expert_blocks import ExpertBlocks, max_padded_rows

# Up to this many assignments the single Triton program runs (a 512-token decode step at top-8);
# above, the torch sort.
TRITON_MAX_ASSIGNMENTS = 4096


def align_to_expert_blocks_torch(
    topk_ids: torch.Tensor, num_experts: int, block_m: int
) -> ExpertBlocks:
    """The torch implementation (the reference, and the path for large prefills)."""
    # Clamped: start-up's dry build pass (kernels/parallel_builds.py) runs torch ops on what the
    # routing kernel, not launched there, left in memory, and an expert id out of range would
    # trip the indexing kernels' device asserts. Real ids are in range already.
    flat = topk_ids.reshape(-1).long().clamp(0, num_experts - 1)
    num_assignments = flat.numel()
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device)
    counts.index_add_(0, flat, torch.ones_like(flat))  # bincount reads its size on the host
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    rank = torch.arange(num_assignments, device=device) - start[sorted_experts]
    position = padded_start[sorted_experts] + rank
    max_rows = max_padded_rows(num_assignments, num_experts, block_m)
    sorted_ids = torch.full((max_rows,), num_assignments, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, position, order.to(torch.int32))
    block_starts = torch.arange(0, max_rows, block_m, device=device)
    block_expert = torch.searchsorted(padded_end, block_starts, right=True)
    block_expert = block_expert.clamp_(max=num_experts - 1).to(torch.int32)
    num_rows = padded_end[-1:].to(torch.int32)
    return ExpertBlocks(sorted_ids, block_expert, num_rows, block_m)


def align_to_expert_blocks(
    topk_ids: torch.Tensor, num_experts: int, block_m: int, with_triton: bool = True
) -> ExpertBlocks:
    """ExpertBlocks of a step's topk_ids [T, k] for blocks of block_m rows: the one-program
    Triton kernel (with_triton, up to TRITON_MAX_ASSIGNMENTS assignments), else torch."""
    num_assignments = topk_ids.numel()
    if not with_triton or num_assignments > TRITON_MAX_ASSIGNMENTS:
        return align_to_expert_blocks_torch(topk_ids, num_experts, block_m)
    # Here, not at the top: the kernel's file imports triton, which a CPU install lacks.
    from ladle.kernels.moe_align_kernel import align_with_triton

    max_rows = max_padded_rows(num_assignments, num_experts, block_m)
    return align_with_triton(topk_ids, num_experts, block_m, max_rows)
