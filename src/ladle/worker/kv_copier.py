"""KVCopier: the worker's side of the host tier, copying KV blocks device <-> host.

A plan's KV operations (protocol/step.py) run at the start of its step, before its forward:

    copier.wait_for_earlier_copies()   # the compute stream waits (on the device) for copies
                                       # issued by earlier steps: loads are in place, and no
                                       # block freed meanwhile is rewritten under a copy
    copier.run(plan.kv_operations)     # this step's copies, on a side stream that first waits
                                       # for every forward already queued (stores read final KV)

so a step's copies overlap its own forward pass and the host never waits for them. On the CPU
the copies are plain synchronous tensor copies into a second pool, which makes the whole path
(scheduler, plan, copy, result) testable in CI.

Layout: the device cache is one [2, blocks, block_size, kv heads, head dim] tensor per layer
(what the attention kernels read), so one block's KV is 2 x num_layers separate chunks. The host
pool has the same layout per layer (one allocation, layer-major), so a run of consecutive block
ids (source and target both consecutive) is one contiguous chunk per layer and K/V: a run costs
2 x num_layers copies whatever its length. Stores of a request's blocks and loads into fresh
blocks are mostly such runs (the free queues hand blocks out in order). Copies move bytes (uint8
views), so the fp8 KV cache and any other dtype copy alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ladle.protocol.step import KV_LOAD, KV_STORE, KVOperation, KVTransferStats

# Bytes moved by the start-up bandwidth probe (each way).
PROBE_BYTES = 64 * 1024 * 1024


@dataclass
class KVReport:
    """A step's KV operations as the worker saw them: issued, failed, and the copy stats."""

    done: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)
    stats: KVTransferStats | None = None

    def fill(self, result) -> None:
        """Put the report on a StepResult."""
        result.kv_operations_done = self.done
        result.kv_operations_failed = self.failed
        result.kv_transfer = self.stats


def block_runs(source_ids: list[int], target_ids: list[int]) -> list[tuple[int, int, int]]:
    """(source start, target start, length) runs of pairs consecutive on both sides, in order."""
    if len(source_ids) != len(target_ids):
        raise ValueError(
            f"a KV copy needs as many target blocks as source blocks, got {len(source_ids)} "
            f"sources and {len(target_ids)} targets"
        )
    runs: list[tuple[int, int, int]] = []
    for source, target in zip(source_ids, target_ids):
        if runs:
            source_start, target_start, length = runs[-1]
            if source == source_start + length and target == target_start + length:
                runs[-1] = (source_start, target_start, length + 1)
                continue
        runs.append((source, target, 1))
    return runs


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """The same memory as uint8 (the last dimension scaled by the element size)."""
    return tensor.view(torch.uint8)


class KVCopier:
    """Copies blocks between the device KV caches and the host pool (one tensor per layer
    each, the same [2, blocks, ...] layout)."""

    def __init__(self, host_caches: list[torch.Tensor], device: torch.device) -> None:
        self.host_caches = [as_bytes(cache) for cache in host_caches]
        self.num_host_blocks = host_caches[0].shape[1] if host_caches else 0
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.is_cuda else None
        # The end of the latest copies that no forward has waited for yet.
        self._last_copies_end: torch.cuda.Event | None = None
        # (start, end) events of copies whose device time is not counted yet.
        self._timed: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._stats = KVTransferStats()

    def wait_for_earlier_copies(self) -> None:
        """Make the current (compute) stream wait for every copy issued so far: call before a
        step's forward, before that step's own copies are issued."""
        if self._last_copies_end is not None:
            torch.cuda.current_stream(self.device).wait_event(self._last_copies_end)
            self._last_copies_end = None

    def run(
        self, operations: list[KVOperation], device_caches: list[torch.Tensor]
    ) -> tuple[list[int], dict[int, str]]:
        """Issue the operations in order; returns (op ids issued, op id -> why it failed).

        A failed operation copies nothing (its ids are checked before any copy starts)."""
        if not operations:
            return [], {}
        done: list[int] = []
        failed: dict[int, str] = {}
        device_bytes = [as_bytes(cache) for cache in device_caches]
        num_device_blocks = device_caches[0].shape[1]
        if self.is_cuda:
            assert self.stream is not None
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
        started = time.perf_counter()
        for operation in operations:
            try:
                runs = self._checked_runs(operation, num_device_blocks)
                if operation.kind == KV_STORE:
                    self._copy(runs, device_bytes, self.host_caches)
                else:
                    self._copy(runs, self.host_caches, device_bytes)
            except Exception as error:  # a bad operation fails alone; the step goes on
                failed[operation.op_id] = f"{type(error).__name__}: {error}"
                continue
            num_bytes = len(operation.source_block_ids) * self.block_bytes(device_caches)
            if operation.kind == KV_STORE:
                self._stats.bytes_to_host += num_bytes
            else:
                self._stats.bytes_to_device += num_bytes
            done.append(operation.op_id)
        if self.is_cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record(self.stream)
            self._last_copies_end = end
            self._timed.append((start, end))
        else:
            self._stats.copy_seconds += time.perf_counter() - started
        return done, failed

    def take_stats(self) -> KVTransferStats | None:
        """What the copies moved since the last call (device time only of copies seen done)."""
        still_running = []
        for start, end in self._timed:
            if end.query():
                self._stats.copy_seconds += start.elapsed_time(end) / 1000.0
            else:
                still_running.append((start, end))
        self._timed = still_running
        stats = self._stats
        if not (stats.bytes_to_host or stats.bytes_to_device or stats.copy_seconds):
            return None
        self._stats = KVTransferStats()
        return stats

    @staticmethod
    def block_bytes(device_caches: list[torch.Tensor]) -> int:
        """Bytes of one block over every layer, K and V."""
        return sum(cache[:, 0].numel() * cache.element_size() for cache in device_caches)

    def _checked_runs(
        self, operation: KVOperation, num_device_blocks: int
    ) -> list[tuple[int, int, int]]:
        if operation.kind == KV_STORE:
            num_sources, num_targets = num_device_blocks, self.num_host_blocks
        elif operation.kind == KV_LOAD:
            num_sources, num_targets = self.num_host_blocks, num_device_blocks
        else:
            raise ValueError(f"KV operation kind {operation.kind!r} is not store or load")
        for name, ids, bound in (
            ("source_block_ids", operation.source_block_ids, num_sources),
            ("target_block_ids", operation.target_block_ids, num_targets),
        ):
            bad = [block_id for block_id in ids if not 0 <= block_id < bound]
            if bad:
                raise ValueError(f"{name} {bad[:4]} outside [0, {bound}) for a {operation.kind}")
        if operation.kind == KV_LOAD and 0 in operation.target_block_ids:
            raise ValueError("target_block_ids: a load may not write the null block 0")
        return block_runs(operation.source_block_ids, operation.target_block_ids)

    def _copy(
        self,
        runs: list[tuple[int, int, int]],
        sources: list[torch.Tensor],
        targets: list[torch.Tensor],
    ) -> None:
        if self.is_cuda:
            with torch.cuda.stream(self.stream):
                for source_start, target_start, length in runs:
                    for source, target in zip(sources, targets):
                        for kv in (0, 1):  # K and V: each a contiguous chunk of the run
                            target[kv, target_start : target_start + length].copy_(
                                source[kv, source_start : source_start + length],
                                non_blocking=True,
                            )
            return
        # The CPU: one gather-scatter per layer moves every block of the operation.
        source_index = torch.tensor(
            [s + i for s, _, n in runs for i in range(n)], dtype=torch.long
        )
        target_index = torch.tensor(
            [t + i for _, t, n in runs for i in range(n)], dtype=torch.long
        )
        for source, target in zip(sources, targets):
            target.index_copy_(1, target_index, source.index_select(1, source_index))


def measure_copy_bandwidth(device: torch.device, num_bytes: int = PROBE_BYTES) -> float:
    """Bytes per second of a host <-> device copy (pinned, both directions averaged) on CUDA,
    of a host memory copy on the CPU. What the swap-or-recompute rule divides by."""
    if device.type == "cuda":
        host = torch.empty(num_bytes, dtype=torch.uint8, pin_memory=True)
        on_device = torch.empty(num_bytes, dtype=torch.uint8, device=device)
        on_device.copy_(host, non_blocking=True)  # first touch outside the timing
        torch.cuda.synchronize(device)
        start, middle, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        on_device.copy_(host, non_blocking=True)
        middle.record()
        host.copy_(on_device, non_blocking=True)
        end.record()
        end.synchronize()
        seconds = (start.elapsed_time(middle) + middle.elapsed_time(end)) / 2000.0
        return num_bytes / seconds
    source = torch.ones(num_bytes, dtype=torch.uint8)
    target = torch.empty_like(source)
    target.copy_(source)  # pages touched outside the timing
    started = time.perf_counter()
    target.copy_(source)
    return num_bytes / max(time.perf_counter() - started, 1e-9)
