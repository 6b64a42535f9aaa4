"""A rank's place in its tensor-parallel group, and the collectives the parallel layers need.

Every layer that splits its weights over ranks takes a TensorParallel and asks it how much of a
dimension is its own (`divide`) and to combine partial results (`all_reduce`, `all_gather`).
With one rank (SINGLE) every collective returns its input: the single-device model is the
same code with nothing to combine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None  # the torch.distributed ProcessGroup of the ranks; None with one rank
    # Mixture-of-experts layers give each rank whole experts (expert parallelism) instead of a
    # slice of every expert's matrices.
    expert_parallel: bool = False
    # A faster all-reduce for small messages where start-up measured one (fast_all_reduce.py):
    # it says which tensors it takes; NCCL (or gloo) does the rest.
    fast_all_reduce: Any = None

    def divide(self, total: int, what: str) -> int:
        """This rank's share of `total` (heads, rows, an intermediate size); a clear error
        naming `what` when the ranks cannot split it evenly."""
        if total % self.size:
            raise ValueError(f"tensor_parallel_size={self.size} does not divide {what} ({total})")
        return total // self.size

    def kv_heads_per_rank(self, num_kv_heads: int) -> int:
        """Key/value heads this rank holds: an even share, or one replicated head when there
        are fewer KV heads than ranks (each then serves size / num_kv_heads query groups)."""
        if num_kv_heads >= self.size:
            return self.divide(num_kv_heads, "the number of key/value heads")
        if self.size % num_kv_heads:
            raise ValueError(
                f"tensor_parallel_size={self.size} is neither a divisor nor a multiple of the "
                f"number of key/value heads ({num_kv_heads})"
            )
        return 1

    def first_kv_head(self, num_kv_heads: int) -> int:
        """The first of this rank's key/value heads in the checkpoint's order."""
        if num_kv_heads >= self.size:
            return self.rank * (num_kv_heads // self.size)
        return self.rank // (self.size // num_kv_heads)

    def all_reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """The sum over ranks of `partial` (in place where the backend allows)."""
        if self.size == 1:
            return partial
        fast = self.fast_all_reduce
        if fast is not None and fast.takes(partial):
            return fast(partial)
        dist.all_reduce(partial, group=self.group)
        return partial

    def all_reduce_max(self, values: torch.Tensor) -> torch.Tensor:
        """The elementwise largest over ranks of `values` (in place where the backend allows)."""
        if self.size == 1:
            return values
        dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.group)
        return values

    def all_gather(self, shard: torch.Tensor) -> torch.Tensor:
        """The ranks' shards concatenated along the last dimension, in rank order."""
        if self.size == 1:
            return shard
        shard = shard.contiguous()
        # Gathered along the first dimension (what every backend takes), then laid side by side.
        gathered = torch.empty(
            (self.size * shard.shape[0], *shard.shape[1:]), dtype=shard.dtype, device=shard.device
        )
        _all_gather_single(gathered, shard, group=self.group)
        by_rank = gathered.view(self.size, *shard.shape).movedim(0, -2)
        return by_rank.reshape(*shard.shape[:-1], self.size * shard.shape[-1])


SINGLE = TensorParallel()
# torch 2.13 renamed all_gather_into_tensor (deprecated there); the GPU image has torch 2.11.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
