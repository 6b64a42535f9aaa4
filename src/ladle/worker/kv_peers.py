"""A producer's KV pool, exported to other processes, and a consumer's pulls from it.

The producer allocates its KV cache as one [layers, 2, blocks, block_size, kv heads, head dim]
tensor (the per-layer caches the kernels read are views of it) that another process can map:
- on the CPU, a file in /dev/shm mapped shared (pages cost nothing until a block is written);
- on CUDA, an ordinary allocation whose CUDA IPC handle the consumer opens.
The descriptor (a JSON string) travels in the handoff to the consumer, which maps the pool once
and then copies blocks straight out of it: a pull is one-sided, so the producer's engine loop
never waits for the consumer's (nothing to pair up, unlike send/recv), and a dead producer
only fails the pulls that name it.

A pull of N blocks moves them for every layer at once: on the CPU one index_select and one
index_copy_ over the stacked layers; on CUDA one cross-device copy per run of consecutive
blocks (a fresh prompt's blocks are mostly one run), which goes over NVLink peer to peer, or,
when the blocks are scattered over many runs, the same gather, one peer copy and a scatter.
Bytes are copied as bytes, so the fp8 KV cache moves as fp8.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import pickle
import time
import uuid

import torch

from ladle.kv_transfer.shm import pool_path, remove_pool
from ladle.protocol.step import KVOperation
from ladle.worker.kv_copier import block_runs, stacked_layers


def export_kv_pool(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, str]:
    """A zeroed stacked KV pool other processes can map, and its descriptor."""
    element_size = torch.empty((), dtype=dtype).element_size()
    num_bytes = element_size
    for size in shape:
        num_bytes *= size
    meta = {"shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
    if device.type == "cpu":
        path = pool_path(os.getpid(), uuid.uuid4().hex[:8])
        stats = os.statvfs(os.path.dirname(path))
        if stats.f_bavail * stats.f_frsize < num_bytes:
            # A sparse file larger than the tmpfs would die with SIGBUS on first touch instead.
            raise ValueError(
                f"the KV pool a producer exports needs {num_bytes / 2**30:.2f} GiB of "
                f"{os.path.dirname(path)}, which has {stats.f_bavail * stats.f_frsize / 2**30:.2f}"
                " GiB free: give the container more shared memory (docker --shm-size) or lower "
                "--cpu-kv-cache-gib"
            )
        with open(path, "wb") as file:
            file.truncate(num_bytes)  # sparse: zero pages until written
        atexit.register(remove_pool, path)
        pool = torch.from_file(path, shared=True, size=num_bytes, dtype=torch.uint8)
        return pool.view(dtype).view(shape), json.dumps({"kind": "shm", "path": path, **meta})
    pool = torch.zeros(shape, dtype=dtype, device=device)
    from torch.multiprocessing.reductions import reduce_tensor

    rebuild, args = reduce_tensor(pool)
    payload = base64.b64encode(pickle.dumps((rebuild, args))).decode()
    token = uuid.uuid4().hex
    # CUDA cannot open an IPC handle in the process that made it: a consumer in this same
    # process (tests, one-process benches) takes the tensor itself.
    _LOCAL_EXPORTS[token] = pool
    return pool, json.dumps({"kind": "cuda_ipc", "device": device.index or 0, "ipc": payload,
                             "token": token, **meta})


# Pools this process exported over CUDA IPC, by token.
_LOCAL_EXPORTS: dict[str, torch.Tensor] = {}


def _map(descriptor: str) -> torch.Tensor:
    info = json.loads(descriptor)
    dtype = getattr(torch, info["dtype"])
    shape = tuple(info["shape"])
    if info["kind"] == "shm":
        element_size = torch.empty((), dtype=dtype).element_size()
        num_bytes = element_size
        for size in shape:
            num_bytes *= size
        if not os.path.exists(info["path"]):
            raise RuntimeError(f"the producer's KV pool {info['path']} is gone (it exited)")
        pool = torch.from_file(info["path"], shared=True, size=num_bytes, dtype=torch.uint8)
        return pool.view(dtype).view(shape)
    if info["kind"] == "cuda_ipc":
        local = _LOCAL_EXPORTS.get(info.get("token", ""))
        if local is not None:
            return local
        rebuild, args = pickle.loads(base64.b64decode(info["ipc"]))
        return rebuild(*args)
    raise RuntimeError(f"unknown KV pool kind {info['kind']!r}")


# How a GPU pull copies a run of consecutive blocks: "kernel", one strided copy over every layer
# (torch runs it on the producer's GPU, writing over NVLink); "memcpy", one contiguous
# peer-to-peer memcpy per layer and K/V (DMA engines, 2 x layers copies a run).
PULL_STRATEGIES = ("kernel", "memcpy")
# Past this many runs ("kernel" strategy) a pull gathers instead: blocks scattered over both
# pools made one small strided copy each (an 8k-token prompt of the 8B shape, 512 scattered
# blocks: 79 GB/s on two H200s, against 308 GB/s for one run).
MAX_RUN_COPIES = 8
# A gathered pull stages at most this many bytes at a time on each GPU.
GATHER_CHUNK_BYTES = 64 << 20


def pull_gathered(
    op: KVOperation,
    remote_bytes: torch.Tensor,
    local_layers: list[torch.Tensor],
    stacked: torch.Tensor | None,
) -> None:
    """A pull as gathers: the source blocks (every layer, K and V) gathered into one staging
    tensor where the pool lives, moved in one copy (peer to peer between GPUs), and scattered
    into the target blocks; in chunks of GATHER_CHUNK_BYTES so that the staging stays small."""
    local = local_layers[0]
    sources = torch.tensor(op.source_block_ids, device=remote_bytes.device)
    targets = torch.tensor(op.target_block_ids, device=local.device)
    block_bytes = max(1, remote_bytes[:, :, 0].numel())
    per_chunk = max(1, GATHER_CHUNK_BYTES // block_bytes)
    for start in range(0, len(sources), per_chunk):
        gathered = remote_bytes.index_select(2, sources[start : start + per_chunk])
        moved = gathered.to(local.device, non_blocking=True)
        into = targets[start : start + per_chunk]
        if stacked is not None:
            stacked.view(torch.uint8).index_copy_(2, into, moved)
        else:
            for index, layer in enumerate(local_layers):
                layer.view(torch.uint8).index_copy_(1, into, moved[index])


class PeerPools:
    """A consumer worker's view of producers' pools: mapped once each, then pulled from."""

    MAX_MAPPED = 4  # producers restart with new pools; the oldest mappings go

    def __init__(self, strategy: str | None = None) -> None:
        strategy = strategy or os.environ.get("LADLE_KV_PULL", "kernel")
        if strategy not in PULL_STRATEGIES:
            raise ValueError(f"LADLE_KV_PULL must be one of {', '.join(PULL_STRATEGIES)}")
        self.strategy = strategy
        self._mapped: dict[str, torch.Tensor] = {}
        self.num_pulls = 0
        self.bytes_pulled = 0
        self.pull_seconds = 0.0

    def pool(self, descriptor: str) -> torch.Tensor:
        pool = self._mapped.get(descriptor)
        if pool is None:
            pool = _map(descriptor)
            if len(self._mapped) >= self.MAX_MAPPED:
                self._mapped.pop(next(iter(self._mapped)))
            self._mapped[descriptor] = pool
        return pool

    def run(
        self, operations: list[KVOperation], local_layers: list[torch.Tensor]
    ) -> tuple[list[int], dict[int, str]]:
        """Pull each operation's blocks into the local caches (one [2, blocks, ...] tensor per
        layer); returns (op ids done, op id -> why it failed). A failure is the operation's
        alone: the scheduler computes that prompt locally instead."""
        done: list[int] = []
        failed: dict[int, str] = {}
        for op in operations:
            try:
                started = time.perf_counter()
                self._pull(op, local_layers)
                self.pull_seconds += time.perf_counter() - started
                self.num_pulls += 1
                done.append(op.op_id)
            except Exception as error:  # noqa: BLE001 - the pull fails, the engine goes on
                self._mapped.pop(op.peer, None)
                failed[op.op_id] = f"KV pull failed: {type(error).__name__}: {error}"
        return done, failed

    def take_stats(self) -> tuple[int, int, float]:
        """(pulls, bytes, seconds) since the last call."""
        stats = (self.num_pulls, self.bytes_pulled, self.pull_seconds)
        self.num_pulls, self.bytes_pulled, self.pull_seconds = 0, 0, 0.0
        return stats

    def _pull(self, op: KVOperation, local_layers: list[torch.Tensor]) -> None:
        remote = self.pool(op.peer)
        first = local_layers[0]
        if (
            remote.shape[0] != len(local_layers)
            or tuple(remote.shape[3:]) != tuple(first.shape[2:])
            or remote.element_size() != first.element_size()
        ):
            raise ValueError(
                f"the producer's pool {tuple(remote.shape)} ({remote.dtype}) does not match "
                f"this one ({len(local_layers)} layers of {tuple(first.shape)}, {first.dtype})"
            )
        num_remote, num_local = remote.shape[2], first.shape[1]
        if len(op.source_block_ids) != len(op.target_block_ids):
            raise ValueError("a pull needs as many target blocks as source blocks")
        if any(not 0 <= i < num_remote for i in op.source_block_ids) or any(
            not 0 <= i < num_local for i in op.target_block_ids
        ):
            raise ValueError("a pull names a block outside a pool")
        remote_bytes = remote.view(torch.uint8) if remote.dtype != torch.uint8 else remote
        stacked = stacked_layers(local_layers)
        runs = block_runs(op.source_block_ids, op.target_block_ids)
        if first.device.type == "cpu" or (self.strategy == "kernel" and len(runs) > MAX_RUN_COPIES):
            pull_gathered(op, remote_bytes, local_layers, stacked)
        else:
            self._pull_runs(runs, remote_bytes, local_layers, stacked)
        self.bytes_pulled += len(op.source_block_ids) * remote_bytes[0, :, 0].numel() * len(
            local_layers
        )

    def _pull_runs(
        self,
        runs: list[tuple[int, int, int]],
        remote_bytes: torch.Tensor,
        local_layers: list[torch.Tensor],
        stacked: torch.Tensor | None,
    ) -> None:
        """A GPU pull: a copy per run of blocks consecutive on both sides (see PULL_STRATEGIES)."""
        for source, target, length in runs:
            chunk = remote_bytes[:, :, source : source + length]
            if stacked is not None and self.strategy == "kernel":
                stacked.view(torch.uint8)[:, :, target : target + length].copy_(
                    chunk, non_blocking=True
                )
                continue
            for index, layer in enumerate(local_layers):
                into = layer.view(torch.uint8)[:, target : target + length]
                if self.strategy == "kernel":
                    into.copy_(chunk[index], non_blocking=True)
                else:
                    for kv in range(2):  # each a contiguous span on both sides
                        into[kv].copy_(chunk[index, kv], non_blocking=True)
