"""Joining the ranks of one engine: torch.distributed over NCCL on CUDA, gloo on the CPU."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from ladle.distributed.tensor_parallel import SINGLE, TensorParallel

# A rank that does not join within this time means another failed to start: say so, not hang.
JOIN_TIMEOUT = datetime.timedelta(minutes=10)


def join_tensor_parallel(
    rank: int, world_size: int, init_method: str | None, device: torch.device
) -> TensorParallel:
    """This process's TensorParallel: SINGLE for one rank, else the world's group once every
    rank has joined at `init_method` (a file:// or tcp:// rendezvous the executor chose)."""
    if world_size == 1:
        return SINGLE
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
    return TensorParallel(rank=rank, size=world_size, group=dist.group.WORLD)


def leave() -> None:
    """Tear the group down (a worker's last act), if one was joined."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_device(device: torch.device, rank: int, world_size: int) -> torch.device:
    """The device of rank `rank`: GPU `rank` of this host on CUDA (one process per GPU), the CPU
    otherwise, where the ranks share the cores evenly instead of each taking all of them."""
    if world_size == 1:
        return device
    if device.type == "cuda":
        available = torch.cuda.device_count()
        if available < world_size:
            raise ValueError(
                f"{world_size} ranks need {world_size} GPUs; this host has {available}"
            )
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        return device
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    return device
