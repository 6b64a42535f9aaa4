"""How an expert-parallel MoE layer gets its tokens to the ranks that hold their experts and the
results back (`--expert-parallel-dispatch`), and the per-step-size table that picks one.

With `-tp N --enable-expert-parallel` every rank holds num_experts / N whole experts, and the
tensor-parallel attention's all-reduce leaves every token's hidden state (and so its routing) on
every rank. Two forms, the same output:

    allreduce  each rank runs its own experts on every token routed to them (others' weights 0)
               and one all-reduce of [T, H] sums the ranks' partial outputs.
    alltoall   rank r takes the r-th 1/N slice of the step's tokens; each of its tokens goes once
               to every rank that holds one of its top-k experts (one all_to_all_single of the
               per-rank counts, then one of the hidden rows and one of their routing); each rank
               runs its experts on what it received; the weighted partial outputs go back the
               same way, the slice's owner sums them, and an all-gather of the slices restores
               the replicated [T, H] the next attention needs.

Bytes a rank sends per step (H hidden in the activation dtype, p = the share of a slice's
tokens that need a given other rank): allreduce 2 (N - 1) / N * T * H (a ring's reduce-scatter
and all-gather); alltoall (N - 1) / N * T * H * (2 p + 1) plus 8 k bytes of routing per
dispatched row. With top-8 of 128 experts on 2 ranks p is about 1 (a token almost always has an
expert on the other rank), so alltoall moves more bytes; what it saves is compute: on the fused
path the allreduce form runs every (token, expert) assignment on every rank (another rank's go
to its last expert with weight 0), while alltoall runs only its own. The split sizes of the
alltoall form are read on the host (one sync a layer), so it is not captured in CUDA graphs: a
graph takes the allreduce form (see SparseMoeBlock.forward). Which is faster depends on T, the
shapes and the link, hence `auto`: worker/expert_dispatch_setup.py times both at start-up.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ladle.config import DISPATCH_MODES
from ladle.distributed.tensor_parallel import TensorParallel

AUTO, ALLREDUCE, ALLTOALL = DISPATCH_MODES
DISPATCH_FORMS = (ALLREDUCE, ALLTOALL)


@dataclass(frozen=True)
class DispatchTable:
    """The dispatch form per step size: sizes ascending, forms[i] serves steps of up to
    sizes[i] tokens (larger steps take the last). seconds[i][form] is what start-up measured
    (the slowest rank's), empty when the form was forced."""

    sizes: tuple[int, ...]
    forms: tuple[str, ...]
    seconds: tuple[dict[str, float], ...] = ()

    def form_for(self, num_tokens: int) -> str:
        index = bisect.bisect_left(self.sizes, num_tokens)
        return self.forms[min(index, len(self.forms) - 1)]

    def describe(self) -> str:
        rows = []
        for i, (size, form) in enumerate(zip(self.sizes, self.forms, strict=True)):
            timing = ""
            if self.seconds:
                times = (f"{name} {s * 1e3:.3f} ms" for name, s in self.seconds[i].items())
                timing = f" ({', '.join(times)})"
            rows.append(f"<= {size} tokens: {form}{timing}")
        return "; ".join(rows)


def forced_table(form: str) -> DispatchTable:
    """Every step size takes `form`."""
    return DispatchTable((1,), (form,))


# What a layer takes until start-up measures (the one-all-reduce form, ladle's first).
DEFAULT_TABLE = forced_table(ALLREDUCE)


def alltoall_experts(
    hidden_states: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    tp: TensorParallel,
    num_local_experts: int,
    run_experts: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """The alltoall form (module docstring) of one MoE layer: [T, H] -> [T, H], the same on
    every rank. weights / expert_ids [T, k]: the step's routing (global expert ids), the same on
    every rank. run_experts(hidden [R, H], weights [R, k], local ids [R, k]) -> [R, H] runs this
    rank's experts on R rows, summed with their weights; ids equal to num_local_experts carry
    weight 0 and add nothing (layers/moe.py local_routing's convention)."""
    num_tokens, top_k = expert_ids.shape
    ranks, rank = tp.size, tp.rank
    per_rank = -(-num_tokens // ranks)
    first = min(rank * per_rank, num_tokens)
    mine = slice(first, min(first + per_rank, num_tokens))
    slice_ids, slice_weights = expert_ids[mine], weights[mine]
    owner = slice_ids // num_local_experts  # [n, k]: the rank of each assignment's expert
    # needs[d, t]: token t of the slice has an expert on rank d; its nonzero positions, in rank
    # order, are the rows sent (a token once per rank, whatever its number of experts there).
    destinations = torch.arange(ranks, device=expert_ids.device)
    needs = (owner.unsqueeze(0) == destinations.view(ranks, 1, 1)).any(dim=-1)
    send_counts = needs.sum(dim=1)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=tp.group)
    # The one host sync: the split sizes (nonzero_static, sized from them, adds none).
    splits = torch.cat([send_counts, recv_counts]).tolist()
    send_splits, recv_splits = splits[:ranks], splits[ranks:]
    positions = torch.nonzero_static(needs, size=sum(send_splits))
    send_rank, send_token = positions[:, 0], positions[:, 1]
    # Each row's routing as its destination runs it: ids local to that rank's stack, others
    # past the stack with weight 0; sent as float32 (ids are exact there) beside the rows.
    local_ids = slice_ids.index_select(0, send_token) - (send_rank * num_local_experts).view(-1, 1)
    owned = (local_ids >= 0) & (local_ids < num_local_experts)
    local_ids = torch.where(owned, local_ids, torch.full_like(local_ids, num_local_experts))
    row_weights = slice_weights.index_select(0, send_token).float() * owned
    send_routing = torch.cat([local_ids.float(), row_weights], dim=1)
    send_rows = hidden_states[mine].index_select(0, send_token)
    num_received = sum(recv_splits)
    recv_rows = hidden_states.new_empty(num_received, hidden_states.shape[1])
    recv_routing = send_routing.new_empty(num_received, 2 * top_k)
    group = tp.group
    dist.all_to_all_single(recv_rows, send_rows, recv_splits, send_splits, group=group)
    dist.all_to_all_single(recv_routing, send_routing, recv_splits, send_splits, group=group)
    recv_ids = recv_routing[:, :top_k].long()
    recv_weights = recv_routing[:, top_k:].to(weights.dtype)
    if num_received:
        partial = run_experts(recv_rows, recv_weights, recv_ids).contiguous()
    else:
        partial = recv_rows  # nothing to run; an empty [0, H] goes back
    returned = send_rows.new_empty(send_rows.shape)
    dist.all_to_all_single(returned, partial, send_splits, recv_splits, group=group)
    # The slice's outputs, padded to per_rank rows so every rank gathers the same size.
    slice_output = hidden_states.new_zeros(per_rank, hidden_states.shape[1])
    slice_output.index_add_(0, send_token, returned)
    gathered = hidden_states.new_empty(ranks * per_rank, hidden_states.shape[1])
    _all_gather_single(gathered, slice_output, group=group)
    return gathered[:num_tokens]


# torch 2.13 renamed all_gather_into_tensor (deprecated there); the GPU image has torch 2.11.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
