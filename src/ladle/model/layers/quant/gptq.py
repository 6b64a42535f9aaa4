"""Calibrated rounding (GPTQ, Frantar et al. 2022): quantize a weight one input column at a time
and push each column's rounding error onto the columns not yet quantized, weighted by the
inverse Hessian of the layer's inputs, so the layer's OUTPUT on calibration inputs moves less
than with round-to-nearest (which only minimises each weight's own error).

    H = mean over calibration tokens of x x^T                          [K, K]
    U = upper Cholesky factor of (H + damping * mean(diag H) * I)^-1
    for each column k:  q_k = round(w_k);  e = (w_k - q_k) / U[k, k];  w_j -= e U[k, j]  (j > k)

By default columns go in their natural order, in blocks of the int4 group size so that each
group's scale and zero are fixed from its weights as they stand when the group is reached (after
the earlier groups' errors were pushed onto them), by round-to-nearest's rule (int4.py) or the
weighted clipping search (int4_clip.py, clip "weighted"), and the result loads as any int4
checkpoint. Act-order (columns by decreasing Hessian diagonal) uses static groups: every group's
parameters fixed before the loop, so column k still belongs to group k // 128 (ladle's loader
and kernels need g_idx = k // 128). On the default model act-order measured no gain (+12.28%
against +12.12% on 8k tokens, docs/benchmarks.md, t12q3). The same loop with fixed per-row
scales rounds fp8 e4m3 weights (gptq_fp8).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F

from ladle.model.layers.quant.fp8 import FP8_DTYPE, FP8_MAX, quantize_fp8_per_row
from ladle.model.layers.quant.int4 import GROUP_SIZE, int4_codes, int4_group_params, num_groups
from ladle.model.layers.quant.int4_clip import search_int4_groups

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
    order: torch.Tensor | None = None,
) -> torch.Tensor:
    """Round weight [N, K] column by column onto `grid`, each error pushed onto later columns;
    returns the rounded weight (float32). Inputs never seen in calibration (zero rows and
    columns of the Hessian) are rounded plainly.

    Lazy blocks: inside a block of `block_size` columns the error goes only to the block's own
    later columns (a [N, width] update per column); the columns after the block get the whole
    block's errors in one matmul when it ends. The result equals pushing every column's error
    onto all later columns at once (the textbook loop), in a fraction of the memory traffic.

    `order` (a permutation of 0..K-1): the columns are visited in that order (act-order:
    the largest Hessian diagonal first, so the inputs that matter most are rounded while the
    most columns are left to absorb their error); `grid.round` still gets each column's own
    index, so a grid with static groups keeps the stored layout."""
    work = weight.float().clone()
    hessian = hessian.float().clone()
    dead = hessian.diagonal() == 0
    hessian[dead, dead] = 1.0
    if order is not None:
        work = work[:, order]
        hessian = hessian[order][:, order]
    upper = inverse_hessian_factor(hessian, damping)
    importance = hessian.diagonal()
    num_inputs = work.shape[1]
    rounded = torch.empty_like(work)
    column_index = order.tolist() if order is not None else list(range(num_inputs))
    for start in range(0, num_inputs, block_size):
        end = min(start + block_size, num_inputs)
        block = work[:, start:end]  # a view: updates land in `work`
        grid.begin_block(start, block, importance[start:end])
        errors = torch.empty_like(block)
        block_upper = upper[start:end, start:end]
        for offset in range(end - start):
            column = block[:, offset]
            value = grid.round(column_index[start + offset], column)
            rounded[:, start + offset] = value
            error = (column - value) / block_upper[offset, offset]
            block[:, offset + 1 :].sub_(error[:, None] * block_upper[offset, offset + 1 :][None, :])
            errors[:, offset] = error
        work[:, end:].sub_(errors @ upper[start:end, end:])
    if order is not None:
        unpermuted = torch.empty_like(rounded)
        unpermuted[:, order] = rounded
        return unpermuted
    return rounded


# How a group's range is chosen inside GPTQ: None, round-to-nearest's full range; "shrink", the
# range shrunk symmetrically by CLIP_RATIOS; "weighted", int4_clip.py's 2-D search (each end
# shrunk separately) weighted by the Hessian's diagonal.
CLIP_MODES = (None, "shrink", "weighted")


def _shrink_search(
    block: torch.Tensor, importance: torch.Tensor, symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    best_scale, best_zero = int4_group_params(block[:, None, :], symmetric)
    best_error = None
    for ratio in CLIP_RATIOS:
        scale, zero = int4_group_params(block[:, None, :] * ratio, symmetric)
        values = (int4_codes(block, scale, zero) - zero) * scale
        error = ((values - block) ** 2 * importance).sum(dim=1, keepdim=True)
        if best_error is None:
            best_error = error
            continue
        better = error < best_error
        best_scale = torch.where(better, scale, best_scale)
        best_zero = torch.where(better, zero, best_zero)
        best_error = torch.where(better, error, best_error)
    return best_scale[:, 0], best_zero[:, 0]


def int4_params(
    weight: torch.Tensor, importance: torch.Tensor, symmetric: bool, clip: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) float32 [N, G] of weight [N, K] by the rule `clip` names (CLIP_MODES)."""
    if clip not in CLIP_MODES:
        raise ValueError(f"int4 clip mode {clip!r} is not one of {CLIP_MODES}")
    if clip == "weighted":
        _, scale, zero = search_int4_groups(weight, importance, symmetric)
        return scale.float(), zero.float()
    if clip == "shrink":
        if weight.shape[1] > GROUP_SIZE:
            raise ValueError("the shrink search runs one group at a time")
        scale, zero = _shrink_search(weight, importance, symmetric)
        return scale[:, None], zero[:, None]
    groups = num_groups(weight.shape[1])
    padded = F.pad(weight, (0, groups * GROUP_SIZE - weight.shape[1]))
    return int4_group_params(padded.view(weight.shape[0], groups, GROUP_SIZE), symmetric)


class Int4Grid(ColumnGrid):
    """int4 groups of GROUP_SIZE inputs, visited in their natural order: each group's scale and
    zero fixed when the group is reached, from its weights as they stand then (after the
    earlier groups' errors were pushed onto them), by the rule `clip` names."""

    def __init__(self, weight: torch.Tensor, symmetric: bool, clip: str | None) -> None:
        rows, cols = weight.shape
        self.symmetric = symmetric
        self.clip = clip
        device = weight.device
        self.codes = torch.empty(rows, cols, dtype=torch.uint8, device=device)
        self.scale = torch.empty(rows, num_groups(cols), device=device)
        self.zero = torch.empty(rows, num_groups(cols), device=device)

    def begin_block(self, start: int, block: torch.Tensor, importance: torch.Tensor) -> None:
        group = start // GROUP_SIZE
        scale, zero = int4_params(block, importance, self.symmetric, self.clip)
        self.scale[:, group], self.zero[:, group] = scale[:, 0], zero[:, 0]

    def round(self, index: int, column: torch.Tensor) -> torch.Tensor:
        group = index // GROUP_SIZE
        scale, zero = self.scale[:, group], self.zero[:, group]
        codes = int4_codes(column, scale, zero)
        self.codes[:, index] = codes.to(torch.uint8)
        return (codes - zero) * scale


class StaticInt4Grid(Int4Grid):
    """Every group's scale and zero fixed BEFORE the loop, from the uncompensated weight (vLLM's
    and AutoGPTQ's "static groups"): columns may then be visited in any order (act-order) and
    column k still belongs to group k // GROUP_SIZE, so the stored layout (g_idx = k // 128)
    and the kernels do not change."""

    def __init__(
        self,
        weight: torch.Tensor,
        importance: torch.Tensor,
        symmetric: bool,
        clip: str | None,
    ) -> None:
        super().__init__(weight, symmetric, clip)
        if clip == "shrink":
            for start in range(0, weight.shape[1], GROUP_SIZE):
                block = weight[:, start : start + GROUP_SIZE].float()
                scale, zero = int4_params(
                    block, importance[start : start + GROUP_SIZE], symmetric, clip
                )
                self.scale[:, start // GROUP_SIZE] = scale[:, 0]
                self.zero[:, start // GROUP_SIZE] = zero[:, 0]
        else:
            self.scale, self.zero = int4_params(weight.float(), importance, symmetric, clip)

    def begin_block(self, start: int, block: torch.Tensor, importance: torch.Tensor) -> None:
        return None


def gptq_int4(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    symmetric: bool = False,
    clip: str | None = None,
    damping: float = DEFAULT_DAMPING,
    act_order: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K], float16 scale [N, G], uint8 zero [N, G]) of weight [N, K], in the
    layout of int4.quantize_int4_groups (group 128, a partial last group its own). `clip`: how
    each group's range is chosen (CLIP_MODES); `act_order`: columns by decreasing Hessian
    diagonal, with static groups."""
    weight = weight.float()
    if act_order:
        importance = hessian.diagonal().float()
        grid: Int4Grid = StaticInt4Grid(weight, importance, symmetric, clip)
        order = torch.argsort(importance, descending=True, stable=True)
    else:
        grid, order = Int4Grid(weight, symmetric, clip), None
    compensate_rounding(weight, hessian, grid, GROUP_SIZE, damping, order)
    return grid.codes, grid.scale.half(), grid.zero.to(torch.uint8)


def gptq_int4_act_order(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    symmetric: bool = False,
    clip: str | None = None,
    damping: float = DEFAULT_DAMPING,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """GPTQ's act-order with groups formed in that order (AutoGPTQ's desc_act without static
    groups): the columns sorted by decreasing Hessian diagonal, quantized in that order with a
    group's scale and zero fixed when the group is reached, then put back in place. Returns
    (codes uint8 [N, K] in the original column order, float16 scale [N, G], uint8 zero [N, G],
    g_idx int32 [K]: the group of each input), the layout of a desc_act checkpoint
    (quant/act_order.py loads it)."""
    weight = weight.float()
    order = torch.argsort(hessian.diagonal().float(), descending=True, stable=True)
    in_order = weight[:, order]
    grid = Int4Grid(in_order, symmetric, clip)
    compensate_rounding(in_order, hessian.float()[order][:, order], grid, GROUP_SIZE, damping)
    codes = torch.empty_like(grid.codes)
    codes[:, order] = grid.codes
    g_idx = torch.empty(weight.shape[1], dtype=torch.int32, device=weight.device)
    g_idx[order] = (torch.arange(weight.shape[1], device=weight.device) // GROUP_SIZE).int()
    return codes, grid.scale.half(), grid.zero.to(torch.uint8), g_idx


def dequantize_int4_scattered(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, g_idx: torch.Tensor
) -> torch.Tensor:
    """float32 [N, K] of an act-order layout: input k takes the scale and zero of group
    g_idx[k]."""
    groups = g_idx.long()
    return (codes.float() - zero.float()[:, groups]) * scale.float()[:, groups]


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
