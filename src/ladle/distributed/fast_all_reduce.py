"""All-reduces over symmetric memory for tensor parallelism's decode steps, each used at the
message sizes where start-up measured it faster than NCCL.

An 8B decode token at TP=2 makes 64 all-reduces of 8 KiB (two per layer). NCCL takes ~18 us for
one inside a CUDA graph on two H200s (NV18), which is 1.15 ms a token against 2.2 ms of weight
reads per GPU; what it spends is protocol and synchronisation, not bytes. A one-shot all-reduce
over symmetric memory (torch.distributed._symmetric_memory) is one kernel: each rank stages its
partial in a buffer every rank has mapped, and every rank reads all the peers' buffers over
NVLink and sums them. At a large batch's messages (the 70B's 256 decode rows: 4 MiB) NCCL picks
its low-latency ring protocol and takes ~46 us on four H200s, while reading every peer's whole
message is too many bytes for one-shot; a two-shot all-reduce (each rank sums its 1/N of the
message from all peers, then every rank gathers the N sums) moves the bytes a ring moves in two
synchronised steps. Both are peer-to-peer loads, not NVLink multicast (which is off on the
machines ladle is measured on and must stay off), so they work wherever the GPUs see each other.

At start-up `choose` times NCCL, one-shot and two-shot at the message sizes a step makes, keeps
the fastest at each size (the ranks agree through a MAX all-reduce of their timings), and checks
the symmetric-memory sums against NCCL's on random data. Anything that fails (no symmetric memory
in this torch, no peer access, a wrong sum) leaves NCCL in charge and says why in the start-up
log.
"""

from __future__ import annotations

import bisect
import dataclasses
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ladle.distributed.tensor_parallel import TensorParallel

NCCL, ONE_SHOT, TWO_SHOT = "nccl", "one-shot", "two-shot"
_METHODS = (NCCL, ONE_SHOT, TWO_SHOT)
# The buffer each rank maps: the largest message a symmetric-memory path may take (bytes): 512
# decode rows of the 70B's 8,192-wide hidden state in bf16. Prefill chunks are larger; NCCL's
# bandwidth protocols serve those.
MAX_BYTES = 8 << 20
# Message sizes timed at start-up (bytes): a decode step's 8 KiB (8B, batch 1) up to a large
# batch's rows.
PROBE_BYTES = (8 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20)
PROBE_ITERATIONS = 30
# The granule of a message the symmetric-memory paths take (bytes); others go to NCCL.
ALIGN_BYTES = 16


@dataclass
class SymmetricMemoryAllReduce:
    """The symmetric-memory all-reduces of one dtype, each at the sizes where it measured
    fastest: `methods[i]` serves messages above `sizes[i - 1]` bytes up to `sizes[i]`, NCCL
    above the last size."""

    buffer: torch.Tensor  # flat, allocated in symmetric memory and rendezvoused
    group_name: str
    sizes: tuple[int, ...] = PROBE_BYTES
    methods: tuple[str, ...] = field(default=(ONE_SHOT,) * len(PROBE_BYTES))
    # Whether this torch has the op that stages the partial and reduces in one kernel: a
    # decode token at TP=4 on the 8B makes 64 of these, and a separate staging copy is one
    # more launch each (~2 us inside a graph).
    fused_copy: bool = False
    has_two_shot: bool = False  # older torch has only the one-shot op

    def available(self, method: str) -> bool:
        return method != TWO_SHOT or self.has_two_shot

    def method_for(self, nbytes: int) -> str:
        index = bisect.bisect_left(self.sizes, nbytes)
        return self.methods[index] if index < len(self.sizes) else NCCL

    def takes(self, tensor: torch.Tensor) -> bool:
        nbytes = tensor.numel() * tensor.element_size()
        return (
            tensor.dtype == self.buffer.dtype
            and tensor.is_contiguous()
            # torch's kernels load whole words (one-shot refuses a size that is not a multiple
            # of 4 bytes); a model's rows always are (hidden sizes are multiples of 16 bytes).
            and nbytes % ALIGN_BYTES == 0
            and self.method_for(nbytes) != NCCL
        )

    def __call__(self, partial: torch.Tensor) -> torch.Tensor:
        """The sums over ranks, in `partial` or a new tensor (callers take the result)."""
        method = self.method_for(partial.numel() * partial.element_size())
        return self.run(method, partial)

    def run(self, method: str, partial: torch.Tensor) -> torch.Tensor:
        staged = self.buffer[: partial.numel()].view(partial.shape)
        if method == ONE_SHOT and self.fused_copy:
            # A fresh output: the kernel's blocks stage and sum different slices, so writing
            # the sums over `partial` could overwrite a slice another block has yet to stage.
            total = torch.empty_like(partial)
            torch.ops.symm_mem.one_shot_all_reduce_copy_out(
                self.buffer[: partial.numel()], partial.view(-1), "sum", self.group_name,
                total.view(-1),
            )
            return total
        staged.copy_(partial)
        if method == ONE_SHOT:
            torch.ops.symm_mem.one_shot_all_reduce_out(staged, "sum", self.group_name, partial)
        else:
            torch.ops.symm_mem.two_shot_all_reduce_out(staged, "sum", self.group_name, partial)
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
    ops = torch.ops.symm_mem
    return SymmetricMemoryAllReduce(
        buffer, group_name, fused_copy=hasattr(ops, "one_shot_all_reduce_copy_out"),
        has_two_shot=hasattr(ops, "two_shot_all_reduce_out"),
    )


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
        timings = _time_methods(fast, group, device, dtype)
    except Exception as error:  # noqa: BLE001
        return None, f"all-reduce: NCCL (timing the symmetric-memory paths failed: {error})"
    fast.methods = fastest_methods(timings)
    measured = ", ".join(
        f"{size >> 10} KiB " + "/".join(f"{timings[m][i]:.1f}" for m in _METHODS)
        for i, size in enumerate(PROBE_BYTES)
    )
    table = f"(NCCL/one-shot/two-shot us: {measured})"
    if all(method == NCCL for method in fast.methods):
        return None, f"all-reduce: NCCL (symmetric memory slower at every size; {table})"
    return fast, f"all-reduce: {describe(PROBE_BYTES, fast.methods)} {table}"


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


def fastest_methods(timings: dict[str, list[float]]) -> tuple[str, ...]:
    """At each probe size, the method with the least time (NCCL on a tie: no gain, no risk)."""
    count = len(timings[NCCL])
    return tuple(
        min(_METHODS, key=lambda method: (timings[method][i], method != NCCL))
        for i in range(count)
    )


def describe(sizes: tuple[int, ...], methods: tuple[str, ...]) -> str:
    """'one-shot up to 1024 KiB, two-shot up to 8192 KiB, NCCL above' for the start-up log."""
    runs: list[tuple[str, int]] = []
    for size, method in zip(sizes, methods):
        if runs and runs[-1][0] == method:
            runs[-1] = (method, size)
        else:
            runs.append((method, size))
    if runs and runs[-1][0] == NCCL:
        runs.pop()  # past the last symmetric-memory size everything is NCCL's anyway
    named = [(("NCCL" if method == NCCL else method), size) for method, size in runs]
    return ", ".join(f"{method} up to {size >> 10} KiB" for method, size in named) + ", NCCL above"


def _probe(size_bytes: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    element_size = torch.empty((), dtype=dtype).element_size()
    return torch.randn(size_bytes // element_size, device=device).to(dtype)


def _everyone(ok: bool, group: Any, device: torch.device) -> bool:
    """Whether `ok` holds on every rank of the group (collective)."""
    flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def _sums_agree(fast, group, device, dtype) -> bool:
    """Whether both symmetric-memory sums equal NCCL's on random data (up to summation
    order), at every probe size."""
    agree = True
    for size in PROBE_BYTES:
        data = _probe(size, dtype, device)
        want = data.clone()
        dist.all_reduce(want, group=group)
        for method in (m for m in (ONE_SHOT, TWO_SHOT) if fast.available(m)):
            got = fast.run(method, data.clone())
            agree &= torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    return agree


def _time_methods(fast, group, device, dtype) -> dict[str, list[float]]:
    """Microseconds per all-reduce of each method at each probe size, the slowest rank's.
    Timed as decode steps run them: PROBE_ITERATIONS calls captured in one CUDA graph, so the
    host's launch cost is not counted for any."""
    runners = {
        NCCL: lambda t: dist.all_reduce(t, group=group),
        ONE_SHOT: lambda t: fast.run(ONE_SHOT, t),
        TWO_SHOT: lambda t: fast.run(TWO_SHOT, t),
    }
    results = []
    for size in PROBE_BYTES:
        data = _probe(size, dtype, device)
        row = []
        for method in _METHODS:
            if not fast.available(method):
                row.append(float("inf"))
                continue
            run = runners[method]
            for _ in range(3):
                run(data)  # warm up outside the capture (NCCL and the kernels set themselves up)
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
            row.append((time.perf_counter() - started) / (3 * PROBE_ITERATIONS) * 1e6)
            del graph
        results.append(row)
    timings = torch.tensor(results, dtype=torch.float64, device=device)
    dist.all_reduce(timings, op=dist.ReduceOp.MAX, group=group)  # every rank decides alike
    return {
        method: [float(value) for value in timings[:, column].tolist()]
        for column, method in enumerate(_METHODS)
    }


def with_fast_all_reduce(
    tp: TensorParallel, device: torch.device, dtype: torch.dtype, disabled: bool = False
) -> TensorParallel:
    """tp with the symmetric-memory all-reduces where start-up measures them faster (CUDA,
    several ranks; `--disable-custom-all-reduce`, vLLM's flag, keeps NCCL). Collective over
    tp's ranks."""
    if tp.size == 1 or device.type != "cuda" or disabled:
        return tp
    fast, line = choose(tp.group, device, dtype)
    if tp.rank == 0:
        print(f"[ladle] {line}", file=sys.stderr, flush=True)
    return dataclasses.replace(tp, fast_all_reduce=fast)
