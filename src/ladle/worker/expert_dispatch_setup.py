"""Start-up of expert parallelism's token dispatch (distributed/expert_dispatch.py): the form
forced by `--expert-parallel-dispatch`, or under `auto` each form timed on the model's own MoE
layer at a few step sizes and the faster kept per size.

Every rank runs the same made-up steps together (both forms are collectives), and each time is
the slowest rank's (an all-reduce MAX), so every rank computes the same table and takes the same
form at every step: one rank taking all-to-all while another all-reduces would hang both.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn

from ladle.distributed.expert_dispatch import (
    AUTO,
    DISPATCH_FORMS,
    DispatchTable,
    forced_table,
)
from ladle.distributed.tensor_parallel import TensorParallel
from ladle.model.layers.moe import SparseMoeBlock

# Step sizes timed under `auto` (those within the step budget, and the budget itself): a decode
# step of one request, small and large decode batches (graph buckets), a full prefill chunk.
TIMED_SIZES = (1, 16, 256)
# Runs timed per form and size after one warm-up run; the median is kept.
TIMED_RUNS = 5


def prepare_expert_dispatch(
    model: nn.Module, tp: TensorParallel, mode: str, max_tokens: int, dtype: torch.dtype
) -> DispatchTable | None:
    """Install the dispatch table on every MoE layer and return it; None when there is nothing
    to dispatch (one rank, no expert parallelism, or no MoE layer)."""
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    if not blocks or tp.size == 1 or not tp.expert_parallel:
        return None
    if mode == AUTO:
        sizes = sorted({s for s in TIMED_SIZES if s < max_tokens} | {max_tokens})
        table = measure_dispatch(blocks[0], tp, sizes, dtype)
    else:
        table = forced_table(mode)
    for block in blocks:
        block.dispatch = table
    return table


@torch.inference_mode()
def measure_dispatch(
    block: SparseMoeBlock, tp: TensorParallel, sizes: list[int], dtype: torch.dtype
) -> DispatchTable:
    """Time every form on `block` at each size (the slowest rank's median) and keep the faster
    per size (the first form on a tie). The layer's expert counts are left as they were."""
    device = block.gate.weight.device
    counts = block.expert_token_counts.clone()
    original = block.dispatch
    generator = torch.Generator(device=device).manual_seed(0)  # the same tokens on every rank
    timings: list[dict[str, float]] = []
    try:
        for size in sizes:
            hidden = torch.randn(
                size, block.gate.hidden_size, generator=generator, device=device, dtype=dtype
            )
            medians = []
            for form in DISPATCH_FORMS:
                block.dispatch = forced_table(form)
                medians.append(_median_seconds(block, hidden))
            slowest = tp.all_reduce_max(torch.tensor(medians, dtype=torch.float64, device=device))
            timings.append(dict(zip(DISPATCH_FORMS, slowest.tolist(), strict=True)))
    finally:
        block.dispatch = original
        block.expert_token_counts.copy_(counts)
    forms = tuple(min(DISPATCH_FORMS, key=timing.__getitem__) for timing in timings)
    return DispatchTable(tuple(sizes), forms, tuple(timings))


def _median_seconds(block: SparseMoeBlock, hidden: torch.Tensor) -> float:
    block(hidden)  # warm-up: first-use allocations and kernel loads
    seconds = []
    for _ in range(TIMED_RUNS):
        _synchronize(hidden.device)
        start = time.perf_counter()
        block(hidden)
        _synchronize(hidden.device)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
