"""The align-block-size step's output (kernels/moe_align.py describes it): what the torch path and
the Triton program (kernels/moe_align_kernel.py) both return, in a file of its own so the
Triton program's file need not import the file that dispatches to it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExpertBlocks:
    """The sorted, padded assignments of one step (kernels/moe_align.py's docstring)."""

    sorted_ids: torch.Tensor
    block_expert: torch.Tensor
    num_rows: torch.Tensor
    block_m: int

    @property
    def max_blocks(self) -> int:
        return self.block_expert.numel()


def max_padded_rows(num_assignments: int, num_experts: int, block_m: int) -> int:
    """Rows the padded assignments can take at most, a whole number of blocks."""
    rows = num_assignments + min(num_experts, num_assignments) * (block_m - 1)
    return -(-rows // block_m) * block_m
