"""Tensor-parallel linear layers: each rank holds a slice of the weight and loads only it.

Column-parallel layers split the output (each rank computes some of the output features: the
query/key/value heads, the MLP's gate and up rows); row-parallel layers split the input and sum
the ranks' partial products (the attention output and the MLP's down projection). A block is a
column-parallel layer, local work, then a row-parallel one, so one all-reduce per block combines
it. With one rank (SINGLE) these are their single-device parents exactly.
"""

from __future__ import annotations

import torch
from torch import nn

from ladle.distributed.tensor_parallel import SINGLE, TensorParallel
from ladle.model.layers.linear import Linear, MergedLinear, QKVLinear
from ladle.model.layers.weight_loading import rank_slice
from ladle.model.load_errors import ModelLoadError


def _refuse_input_permutation(layer: Linear, param: nn.Parameter, tp: TensorParallel) -> None:
    if param is layer.input_permutation and tp.size > 1:
        raise ModelLoadError(
            "act-order (desc_act) int4 checkpoints cannot be split over tensor-parallel ranks "
            "yet; use tensor_parallel_size=1"
        )


def _rank_rows(
    layer: Linear, param: nn.Parameter, loaded: torch.Tensor, start: int, rows: int, total: int
) -> torch.Tensor:
    """Rows [start, start + rows) of a column-parallel layer's checkpoint tensor of `total`
    rows: this rank's (the whole tensor with one rank)."""
    _refuse_input_permutation(layer, param, layer.tp)
    if layer.tp.size == 1 or param is layer.input_permutation:
        return loaded
    return rank_slice(loaded, 0, start, rows, total)


class ColumnParallelLinear(Linear):
    """Output features split over the ranks: this rank computes output_size / tp of them."""

    def __init__(
        self, input_size: int, output_size: int, tp: TensorParallel = SINGLE, bias: bool = False
    ) -> None:
        super().__init__(input_size, tp.divide(output_size, "the output size"), bias)
        self.tp = tp

    @torch.no_grad()
    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        rows = self.output_size
        loaded_weight = _rank_rows(
            self, param, loaded_weight, self.tp.rank * rows, rows, rows * self.tp.size
        )
        super().weight_loader(param, loaded_weight, shard_id)


class MergedColumnParallelLinear(MergedLinear):
    """[gate; up] with each projection's rows split over the ranks: this rank holds its slice
    of gate stacked on its slice of up, so SiLU-and-mul pairs them as on one device."""

    def __init__(
        self,
        input_size: int,
        output_sizes: list[int],
        tp: TensorParallel = SINGLE,
        bias: bool = False,
    ) -> None:
        local = [tp.divide(size, "each merged projection's output size") for size in output_sizes]
        super().__init__(input_size, local, bias)
        self.tp = tp

    @torch.no_grad()
    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        _, rows = self.shard_rows(shard_id)
        loaded_weight = _rank_rows(
            self, param, loaded_weight, self.tp.rank * rows, rows, rows * self.tp.size
        )
        super().weight_loader(param, loaded_weight, shard_id)


class QKVParallelLinear(QKVLinear):
    """The merged query/key/value projection with the heads split over the ranks. Key/value
    heads are split too, or, where there are fewer of them than ranks, each rank keeps the one
    its query heads attend to (replicated, as grouped-query attention groups them)."""

    def __init__(
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        tp: TensorParallel = SINGLE,
        bias: bool = False,
    ) -> None:
        self.total_num_kv_heads = num_kv_heads
        super().__init__(
            hidden_size,
            head_dim,
            tp.divide(num_heads, "the number of attention heads"),
            tp.kv_heads_per_rank(num_kv_heads),
            bias,
        )
        self.head_dim = head_dim
        self.tp = tp

    @torch.no_grad()
    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        if shard_id == "q":
            start, rows, total = self.tp.rank * self.q_size, self.q_size, self.q_size * self.tp.size
        else:
            start = self.tp.first_kv_head(self.total_num_kv_heads) * self.head_dim
            rows, total = self.kv_size, self.total_num_kv_heads * self.head_dim
        loaded_weight = _rank_rows(self, param, loaded_weight, start, rows, total)
        super().weight_loader(param, loaded_weight, shard_id)


class RowParallelLinear(Linear):
    """Input features split over the ranks: each multiplies its slice of the input (the
    column-parallel layer's output, already split) by its columns of the weight, and the
    partial products are summed over the ranks. The bias is rank 0's alone (the others hold
    zeros), so the sum adds it once."""

    def __init__(
        self, input_size: int, output_size: int, tp: TensorParallel = SINGLE, bias: bool = False
    ) -> None:
        super().__init__(tp.divide(input_size, "the input size"), output_size, bias)
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(super().forward(x))

    @torch.no_grad()
    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | int | None = None
    ) -> None:
        _refuse_input_permutation(self, param, self.tp)
        if self.tp.size > 1:
            if param is self.bias:
                if self.tp.rank != 0:
                    loaded_weight = torch.zeros_like(loaded_weight)
            elif param.dim() > 1 and not (param.shape[1] == 1 and loaded_weight.shape[-1] == 1):
                # The weight, or a quantized form's tensor (codes, group scales, zeros): every
                # one is laid out by output row with its columns in input order, so this rank's
                # share of the columns is its share of the inputs. A per-row scale (one column)
                # is every rank's.
                columns = param.shape[1]
                if loaded_weight.shape[-1] != columns * self.tp.size and columns != self.input_size:
                    raise ModelLoadError(
                        f"a quantized tensor of {loaded_weight.shape[-1]} columns cannot be split "
                        f"over {self.tp.size} ranks of {self.input_size} inputs each (its groups "
                        "would straddle ranks); use a tensor_parallel_size that splits the "
                        "inputs into whole groups"
                    )
                loaded_weight = rank_slice(
                    loaded_weight, 1, self.tp.rank * columns, columns, columns * self.tp.size
                )
        super().weight_loader(param, loaded_weight, shard_id)
