"""Joining the ranks of one engine: torch.distributed over NCCL on CUDA, gloo on the CPU."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from ladle.distributed.pipeline import SINGLE_STAGE, PipelineStage
from ladle.distributed.tensor_parallel import SINGLE, TensorParallel

# A rank that does not join within this time means another failed to start: say so, not hang.
JOIN_TIMEOUT = datetime.timedelta(minutes=10)


def join_ranks(
    rank: int,
    tensor_parallel_size: int,
    pipeline_parallel_size: int,
    init_method: str | None,
    device: torch.device,
    expert_parallel: bool = False,
) -> tuple[TensorParallel, PipelineStage]:
    """This process's tensor-parallel group and pipeline stage, once every rank has joined at
    `init_method` (a file:// or tcp:// rendezvous the executor chose). One rank: nothing to
    join."""
    world_size = tensor_parallel_size * pipeline_parallel_size
    if world_size == 1:
        return SINGLE, SINGLE_STAGE
    if init_method is None:
        raise ValueError(f"{world_size} ranks need a rendezvous address (init_method)")
    backend = "nccl" if device.type == "cuda" else "gloo"
    options = dict(device_id=device) if device.type == "cuda" else {}
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=JOIN_TIMEOUT,
        **options,
    )
    stage_index, tp_rank = divmod(rank, tensor_parallel_size)
    group = dist.group.WORLD
    forward_group = result_group = None
    if pipeline_parallel_size > 1:
        # Every rank makes every stage's group, in the same order (new_group is collective).
        stage_groups = [
            dist.new_group(list(range(s * tensor_parallel_size, (s + 1) * tensor_parallel_size)))
            for s in range(pipeline_parallel_size)
        ]
        group = stage_groups[stage_index] if tensor_parallel_size > 1 else None
        # The pipeline's own groups (pipeline.py): hand-offs forward, sampled ids back.
        forward_group = dist.new_group(list(range(world_size)))
        last_stage = (pipeline_parallel_size - 1) * tensor_parallel_size
        result_group = dist.new_group(list(range(last_stage + 1)))
    tp = TensorParallel(
        rank=tp_rank, size=tensor_parallel_size, group=group, expert_parallel=expert_parallel
    )
    stage = PipelineStage(
        index=stage_index,
        size=pipeline_parallel_size,
        tp_size=tensor_parallel_size,
        tp_rank=tp_rank,
        forward_group=forward_group,
        result_group=result_group,
    )
    return tp, stage


def min_over_world(value: int, device: torch.device) -> int:
    """The smallest of every rank's values (every rank gets it): one KV pool plan for all."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def leave() -> None:
    """Tear the group down (a worker's last act), if one was joined."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_device(
    device: torch.device, rank: int, world_size: int, device_index: int | None = None
) -> torch.device:
    """The device of rank `rank`: GPU `rank` of this host on CUDA (one process per GPU), or GPU
    `device_index` where the process sees only its own (a Ray actor); the CPU otherwise, where
    the ranks share the cores evenly instead of each taking all of them."""
    if world_size == 1:
        if device.type == "cuda" and device.index is not None:
            # An engine placed on one GPU of several (a disaggregated instance, a local
            # replica): kernels that launch on the current device must find it there.
            torch.cuda.set_device(device)
        return device
    if device.type == "cuda":
        available = torch.cuda.device_count()
        if device_index is None and available < world_size:
            raise ValueError(
                f"{world_size} ranks need {world_size} GPUs; this host has {available}"
            )
        device = torch.device("cuda", rank if device_index is None else device_index)
        torch.cuda.set_device(device)
        return device
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    return device
