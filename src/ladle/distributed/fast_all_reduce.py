"""A small-message all-reduce over symmetric memory, for tensor parallelism's decode steps.

An 8B decode token at TP=2 makes 64 all-reduces of 8 KiB (two per layer). NCCL takes ~18 us for
one inside a CUDA graph on two H200s (NV18), which is 1.15 ms a token against 2.2 ms of weight
reads per GPU; what it spends is protocol and synchronisation, not bytes. A one-shot all-reduce
over symmetric memory (torch.distributed._symmetric_memory) is one kernel: each rank copies its
partial into a buffer every rank has mapped, and every rank reads all the peers' buffers over
NVLink and sums them. That is peer-to-peer loads, not NVLink multicast (which is off on the
machines ladle is measured on and must stay off), so it works wherever the GPUs see each other.

It is used only where it measures faster and gives NCCL's sums. At start-up `choose` times both
paths at the message sizes a step makes, takes the largest size up to which the one-shot path is
faster on every rank (the ranks agree through a MAX all-reduce of their timings), and checks its
sums against NCCL's on random data. Anything that fails (no symmetric memory in this torch, no
peer access, a wrong sum) leaves NCCL in charge and says why in the start-up log.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ladle.distributed.tensor_parallel import TensorParallel

# The buffer each rank maps: the largest message the one-shot path may take (bytes).
MAX_BYTES = 1 << 20
# Message sizes timed at start-up (bytes): a decode step's 8 KiB (8B, batch 1) up to a large
# batch's rows.
PROBE_BYTES = (8 << 10, 64 << 10, 256 << 10, 1 << 20)
PROBE_ITERATIONS = 30


@dataclass
class SymmetricMemoryAllReduce:
    """The one-shot all-reduce for messages up to max_bytes of one dtype (the sums come back
    in `partial` or, with the fused staging op, in a new tensor: callers take the result)."""

    buffer: torch.Tensor  # flat, allocated in symmetric memory and rendezvoused
    group_name: str
    max_bytes: int
    # Whether this torch has the op that stages the partial and reduces in one kernel: a
    # decode token at TP=4 on the 8B makes 64 of these, and a separate staging copy is one
    # more launch each (~2 us inside a graph).
    fused_copy: bool = False

    def takes(self, tensor: torch.Tensor) -> bool:
        return (
            tensor.dtype == self.buffer.dtype
            and tensor.is_contiguous()
            and tensor.numel() * tensor.element_size() <= self.max_bytes
        )

    def __call__(self, partial: torch.Tensor) -> torch.Tensor:
        staged = self.buffer[: partial.numel()].view(partial.shape)
        if self.fused_copy:
            # A fresh output: the kernel's blocks stage and sum different slices, so writing
            # the sums over `partial` could overwrite a slice another block has yet to stage.
            total = torch.empty_like(partial)
            torch.ops.symm_mem.one_shot_all_reduce_copy_out(
                staged, partial, "sum", self.group_name, total
            )
            return total
        staged.copy_(partial)
        torch.ops.symm_mem.one_shot_all_reduce_out(staged, "sum", self.group_name, partial)
        return partial


def build(group: Any, device: torch.device, dtype: torch.dtype) -> SymmetricMemoryAllReduce:
    """Allocate and map the buffer on every rank of `group` (collective)."""
    from torch.distributed import _symmetric_memory as symm_mem

    group_name = group.group_name
    enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
    if enable is not None:
        enable(group_name)  # older torch needs it; newer ones accept and ignore it
    element_size = torch.empty((), dtype=dtype).element_size()
    buffer = symm_mem.empty(MAX_BYTES // element_size, dtype=dtype, device=device)
    symm_mem.rendezvous(buffer, group_name)
    fused_copy = hasattr(torch.ops.symm_mem, "one_shot_all_reduce_copy_out")
    return SymmetricMemoryAllReduce(buffer, group_name, MAX_BYTES, fused_copy)


def choose(
    group: Any, device: torch.device, dtype: torch.dtype
) -> tuple[SymmetricMemoryAllReduce | None, str]:
    """The one-shot path with its size limit set where it measured faster, or None; and a line
    for the start-up log saying what was chosen and why. Collective: every rank calls it."""
    # Every step below is collective: the ranks agree after each one, so a rank that failed
    # alone does not leave the others waiting in a collective it will never join.
    fast, reason = None, ""
    try:
        reachable = peers_reachable(_rank_places(group, device), _device_index(device),
                                    torch.cuda.can_device_access_peer)
    except Exception as error:  # noqa: BLE001
        reachable, reason = False, f"{type(error).__name__}: {error}"
    if not _everyone(reachable, group, device):
        # Another host, or no peer access (PCIe without P2P): the one-shot kernel's peer loads
        # would fail or hang, so it is not even tried.
        why = f": {reason}" if reason else ""
        return None, f"all-reduce: NCCL (ranks not all peer-reachable GPUs of one host{why})"
    try:
        fast = build(group, device, dtype)
    except Exception as error:  # noqa: BLE001 -- any failure keeps NCCL, said in the log
        reason = f"{type(error).__name__}: {error}"
    if not _everyone(fast is not None, group, device):
        return None, f"all-reduce: NCCL (symmetric memory unavailable: {reason or 'on a peer'})"
    try:
        sums_agree = _sums_agree(fast, group, device, dtype)
    except Exception as error:  # noqa: BLE001
        sums_agree, reason = False, f"{type(error).__name__}: {error}"
    if not _everyone(sums_agree, group, device):
        return None, f"all-reduce: NCCL (one-shot sums differ from NCCL's {reason})".strip()
    try:
        nccl_us, fast_us = _time_both(fast, group, device, dtype)
    except Exception as error:  # noqa: BLE001
        return None, f"all-reduce: NCCL (timing the one-shot path failed: {error})"
    timings = ", ".join(
        f"{size >> 10} KiB {a:.1f}/{b:.1f} us" for size, a, b in zip(PROBE_BYTES, nccl_us, fast_us)
    )
    limit = size_limit(PROBE_BYTES, nccl_us, fast_us)
    if limit == 0:
        return None, f"all-reduce: NCCL (one-shot slower at every size; NCCL/one-shot {timings})"
    fast.max_bytes = limit
    return fast, (
        f"all-reduce: one-shot over symmetric memory up to {limit >> 10} KiB, NCCL above "
        f"(NCCL/one-shot {timings})"
    )


def peers_reachable(
    places: list[tuple[str, int]], my_index: int, can_access: Any
) -> bool:
    """Whether every rank's GPU (places: (host, device index) per rank) is on this rank's host
    and reachable from this rank's GPU by peer access (can_access(mine, theirs))."""
    host = places[0][0]
    return all(
        place_host == host and (index == my_index or can_access(my_index, index))
        for place_host, index in places
    )


def _rank_places(group: Any, device: torch.device) -> list[tuple[str, int]]:
    """(host name, device index) of every rank of the group (collective)."""
    import socket

    places: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(places, (socket.gethostname(), _device_index(device)), group=group)
    return [tuple(place) for place in places]


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def size_limit(sizes: tuple[int, ...], nccl_us: list[float], fast_us: list[float]) -> int:
    """The largest size of the unbroken run, from the smallest, at which the one-shot path
    was faster (0: none); a size past a loss is not trusted."""
    limit = 0
    for size, nccl, fast in zip(sizes, nccl_us, fast_us):
        if fast >= nccl:
            break
        limit = size
    return limit


def _probe(size_bytes: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    element_size = torch.empty((), dtype=dtype).element_size()
    return torch.randn(size_bytes // element_size, device=device).to(dtype)


def _everyone(ok: bool, group: Any, device: torch.device) -> bool:
    """Whether `ok` holds on every rank of the group (collective)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _sums_agree(fast, group, device, dtype) -> bool:
    """Whether the one-shot sums equal NCCL's on random data (up to summation order)."""
    agree = True
    for size in PROBE_BYTES:
        data = _probe(size, dtype, device)
        want = data.clone()
        dist.all_reduce(want, group=group)
        got = fast(data.clone())
        agree &= torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    return agree


def _time_both(fast, group, device, dtype) -> tuple[list[float], list[float]]:
    """Microseconds per all-reduce at each probe size, NCCL and one-shot, the slowest rank's.
    Timed as decode steps run them: PROBE_ITERATIONS calls captured in one CUDA graph, so the
    host's launch cost is not counted for either."""
    results = []
    for size in PROBE_BYTES:
        data = _probe(size, dtype, device)
        pair = []
        for run in (lambda t: dist.all_reduce(t, group=group), fast):
            for _ in range(3):
                run(data)  # warm up outside the capture (NCCL and the kernel set themselves up)
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(PROBE_ITERATIONS):
                    run(data)
            graph.replay()
            torch.cuda.synchronize(device)
            started = time.perf_counter()
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize(device)
            pair.append((time.perf_counter() - started) / (3 * PROBE_ITERATIONS) * 1e6)
            del graph
        results.append(pair)
    timings = torch.tensor(results, dtype=torch.float64, device=device)
    dist.all_reduce(timings, op=dist.ReduceOp.MAX, group=group)  # every rank decides alike
    nccl_us = [float(value) for value in timings[:, 0].tolist()]
    fast_us = [float(value) for value in timings[:, 1].tolist()]
    return nccl_us, fast_us


def with_fast_all_reduce(
    tp: TensorParallel, device: torch.device, dtype: torch.dtype, disabled: bool = False
) -> TensorParallel:
    """tp with the one-shot all-reduce where start-up measures it faster (CUDA, several ranks;
    `--disable-custom-all-reduce`, vLLM's flag, keeps NCCL). Collective over tp's ranks."""
    if tp.size == 1 or device.type != "cuda" or disabled:
        return tp
    fast, line = choose(tp.group, device, dtype)
    if tp.rank == 0:
        print(f"[ladle] {line}", file=sys.stderr, flush=True)
    return dataclasses.replace(tp, fast_all_reduce=fast)
