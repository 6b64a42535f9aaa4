"""Calibrated rounding (GPTQ, Frantar et al. 2022): quantize a weight one input column at a time
and push each column's rounding error onto the columns not yet quantized, weighted by the
inverse Hessian of the layer's inputs, so the layer's OUTPUT on calibration inputs moves less
than with round-to-nearest (which only minimises each weight's own error).

    H = mean over calibration tokens of x x^T                          [K, K]
    U = upper Cholesky factor of (H + damping * mean(diag H) * I)^-1
    for each column k:  q_k = round(w_k);  e = (w_k - q_k) / U[k, k];  w_j -= e U[k, j]  (j > k)

Columns go in their natural order (no act-order: ladle's loader needs g_idx = k // 128), in
blocks of the int4 group size so that each group's scale and zero are fixed from its weights as
they stand when the group is reached (after the earlier groups' errors were pushed onto them), by
the same rule as round-to-nearest (int4.py), and the result loads as any int4 checkpoint.
The same loop with fixed per-row scales rounds fp8 e4m3 weights (gptq_fp8).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from ladle.model.layers.quant.fp8 import FP8_DTYPE, FP8_MAX, quantize_fp8_per_row
from ladle.model.layers.quant.int4 import GROUP_SIZE, int4_codes, int4_group_params, num_groups

DEFAULT_DAMPING = 0.01
# Clipping ratios tried per group by the optional search: the group's range shrunk by each, the
# one with the least Hessian-weighted squared error kept (round-to-nearest inside it).
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)


class HessianAccumulator:
    """The running mean of x x^T over a layer's input rows (float32; float64 costs 10x on the
    CPU and the Cholesky below is damped)."""

    def __init__(self, num_inputs: int, device: torch.device | str = "cpu") -> None:
        self.sum = torch.zeros(num_inputs, num_inputs, device=device)
        self.num_rows = 0

    def add(self, inputs: torch.Tensor) -> None:
        rows = inputs.reshape(-1, inputs.shape[-1]).float()
        self.sum.addmm_(rows.t(), rows)
        self.num_rows += rows.shape[0]

    def hessian(self) -> torch.Tensor:
        return self.sum / max(self.num_rows, 1)


class ColumnGrid(ABC):
    """What the compensation loop rounds onto: a block's parameters and a column's rounding."""

    @abstractmethod
    def begin_block(self, start: int, block: torch.Tensor, importance: torch.Tensor) -> None:
        """Fix the parameters of columns start..start+width from their current values [N, width]
        (importance: the Hessian's diagonal over those columns)."""

    @abstractmethod
    def round(self, index: int, column: torch.Tensor) -> torch.Tensor:
        """The rounded (dequantized) value of column `index` [N]; the grid keeps its codes."""


def inverse_hessian_factor(hessian: torch.Tensor, damping: float) -> torch.Tensor:
    """Upper Cholesky factor of the damped inverse Hessian; damping grows until it factors."""
    diagonal_mean = hessian.diagonal().mean().clamp(min=1e-12)
    for attempt in range(6):
        damped = hessian.clone()
        damped.diagonal().add_(damping * 10**attempt * diagonal_mean)
        factor, info = torch.linalg.cholesky_ex(damped)
        if info == 0:
            inverse = torch.cholesky_inverse(factor)
            upper, info = torch.linalg.cholesky_ex(inverse, upper=True)
            if info == 0:
                return upper
    raise ValueError("the calibration Hessian is not positive definite even with damping 1e4")


@torch.no_grad()
def compensate_rounding(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    grid: ColumnGrid,
    block_size: int = GROUP_SIZE,
    damping: float = DEFAULT_DAMPING,
) -> torch.Tensor:
    """Round weight [N, K] column by column onto `grid`, each error pushed onto later columns;
    returns the rounded weight (float32). Inputs never seen in calibration (zero rows and
    columns of the Hessian) are rounded plainly."""
    work = weight.float().clone()
    hessian = hessian.float().clone()
    dead = hessian.diagonal() == 0
    hessian[dead, dead] = 1.0
    upper = inverse_hessian_factor(hessian, damping)
    importance = hessian.diagonal()
    num_inputs = work.shape[1]
    rounded = torch.empty_like(work)
    for start in range(0, num_inputs, block_size):
        end = min(start + block_size, num_inputs)
        block = work[:, start:end]  # a view: updates land in `work`
        grid.begin_block(start, block, importance[start:end])
        errors = torch.empty_like(block)
        block_upper = upper[start:end, start:end]
        for offset in range(end - start):
            column = block[:, offset]
            value = grid.round(start + offset, column)
            rounded[:, start + offset] = value
            error = (column - value) / block_upper[offset, offset]
            block[:, offset + 1 :].sub_(error[:, None] * block_upper[offset, offset + 1 :][None, :])
            errors[:, offset] = error
        work[:, end:].sub_(errors @ upper[start:end, end:])
    return rounded


class Int4Grid(ColumnGrid):
    """int4 groups of GROUP_SIZE inputs: scale and zero per (row, group) by int4.py's rule,
    optionally with the group's range clipped to the ratio of CLIP_RATIOS that has the least
    importance-weighted squared error."""

    def __init__(self, weight: torch.Tensor, symmetric: bool, search_clip: bool) -> None:
        rows, cols = weight.shape
        self.symmetric = symmetric
        self.search_clip = search_clip
        device = weight.device
        self.codes = torch.empty(rows, cols, dtype=torch.uint8, device=device)
        self.scale = torch.empty(rows, num_groups(cols), device=device)
        self.zero = torch.empty(rows, num_groups(cols), device=device)

    def begin_block(self, start: int, block: torch.Tensor, importance: torch.Tensor) -> None:
        group = start // GROUP_SIZE
        best_scale, best_zero = int4_group_params(block[:, None, :], self.symmetric)
        if self.search_clip:
            best_error = None
            for ratio in CLIP_RATIOS:
                scale, zero = int4_group_params(block[:, None, :] * ratio, self.symmetric)
                values = (int4_codes(block, scale, zero) - zero) * scale
                error = ((values - block) ** 2 * importance).sum(dim=1, keepdim=True)
                if best_error is None:
                    best_error = error
                    continue
                better = error < best_error
                best_scale = torch.where(better, scale, best_scale)
                best_zero = torch.where(better, zero, best_zero)
                best_error = torch.where(better, error, best_error)
        self.scale[:, group], self.zero[:, group] = best_scale[:, 0], best_zero[:, 0]

    def round(self, index: int, column: torch.Tensor) -> torch.Tensor:
        group = index // GROUP_SIZE
        scale, zero = self.scale[:, group], self.zero[:, group]
        codes = int4_codes(column, scale, zero)
        self.codes[:, index] = codes.to(torch.uint8)
        return (codes - zero) * scale


def gptq_int4(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    symmetric: bool = False,
    search_clip: bool = False,
    damping: float = DEFAULT_DAMPING,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K], float16 scale [N, G], uint8 zero [N, G]) of weight [N, K], in the
    layout of int4.quantize_int4_groups (group 128, a partial last group its own)."""
    grid = Int4Grid(weight, symmetric, search_clip)
    compensate_rounding(weight, hessian, grid, GROUP_SIZE, damping)
    return grid.codes, grid.scale.half(), grid.zero.to(torch.uint8)


class Fp8RowGrid(ColumnGrid):
    """float8 e4m3 with one scale per output row, fixed from the row's maximum before any
    compensation (the scale rule of fp8.py); a compensated value beyond +-448 saturates."""

    def __init__(self, weight: torch.Tensor) -> None:
        _, self.scale = quantize_fp8_per_row(weight)
        self.codes = torch.empty(weight.shape, dtype=FP8_DTYPE, device=weight.device)

    def begin_block(self, start: int, block: torch.Tensor, importance: torch.Tensor) -> None:
        return None

    def round(self, index: int, column: torch.Tensor) -> torch.Tensor:
        codes = (column / self.scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        self.codes[:, index] = codes
        return codes.float() * self.scale


def gptq_fp8(
    weight: torch.Tensor, hessian: torch.Tensor, damping: float = DEFAULT_DAMPING
) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 codes [N, K], float32 scale [N]) of weight [N, K]: fp8.py's per-row scales, the
    codes chosen by error compensation instead of rounding each weight to its nearest."""
    grid = Fp8RowGrid(weight.float())
    compensate_rounding(weight, hessian, grid, GROUP_SIZE, damping)
    return grid.codes, grid.scale
