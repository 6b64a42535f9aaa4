"""KVCopier: the worker's side of the host tier, copying KV blocks device <-> host.

A plan's KV operations (protocol/step.py) run at the start of its step, before its forward:

    copier.wait_for_earlier_copies()   # the compute stream waits (on the device) for copies
                                       # issued by earlier steps: loads are in place, and no
                                       # block freed meanwhile is rewritten under a copy
    copier.run(plan.kv_operations)     # this step's copies, on a side stream that first waits
                                       # for every forward already queued (stores read final KV)

so a step's copies overlap its own forward pass and the host never waits for them; only an
operation marked before_forward (a store of blocks the step itself rewrites) makes this step's
forward wait for it, on the device. On the CPU
the copies are plain synchronous tensor copies into a second pool, which makes the whole path
(scheduler, plan, copy, result) testable in CI.

Layout, and how many copies. The attention kernels read one [2, blocks, block_size, kv heads,
head dim] tensor per layer, so in the device cache one block's KV is 2 x num_layers separate
chunks; copying those one by one would cost 2 x num_layers DMAs (56 for Qwen3-0.6B) per run of
blocks, a few microseconds of host time each, every step. Instead:
- with the host tier on, the Worker allocates every layer's cache as a view of one [layers, 2,
  blocks, ...] tensor (the per-layer tensors the kernels see are unchanged), so one index_select
  gathers a batch of blocks from every layer at once;
- the host pool is block-major, [host blocks, layers, 2, block_size, kv heads, head dim]: a host
  block is one contiguous span holding its KV for every layer;
- a store gathers up to `staging_blocks` blocks into a block-major device staging buffer (one
  gather, one transposing copy) and moves each run of consecutive host blocks with ONE DMA for
  all layers; a load is the mirror image (a DMA per host run into staging, one scatter).
So a batch costs a handful of launches plus one DMA per host-block run, whatever the number of
layers. Copies move raw words (integer views of the caches, 8 bytes wide where the head's
bytes allow), so the fp8 KV cache and every other dtype copy alike. Not bytes: the gather and
the block-major copy are elementwise kernels with per-element index arithmetic, and a uint8 view
has 8x the elements of an int64 one (on the CPU a 15-block gather of the 0.6B shape took 24.8 ms
as uint8, 5.8 ms as int64); on CUDA they run beside the forward, on the same SMs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ladle.protocol.step import KV_LOAD, KV_STORE, KVOperation, KVTransferStats

# Bytes moved by the start-up bandwidth probe (each way).
PROBE_BYTES = 64 * 1024 * 1024
# The device staging buffer of a batch of copies (CUDA): its blocks are gathered or scattered
# for all layers at once; larger batches go through it in chunks.
STAGING_BYTES = 64 * 1024 * 1024


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


# Widest first: a view of the KV memory as the widest integer its last dimension and its
# address divide into.
_WORD_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)


def as_words(tensor: torch.Tensor) -> torch.Tensor:
    """The same memory as the widest integer dtype that tiles the last dimension exactly (int64
    for a bf16 head of 128: 32 words), so copies move fewer, wider elements."""
    row_bytes = tensor.shape[-1] * tensor.element_size()
    address = tensor.data_ptr()
    for dtype in _WORD_DTYPES:
        width = torch.empty((), dtype=dtype).element_size()
        if row_bytes % width == 0 and address % width == 0:
            return tensor.view(dtype)
    return tensor.view(torch.uint8)


def stacked_layers(layers: list[torch.Tensor]) -> torch.Tensor | None:
    """The [layers, ...] tensor the per-layer caches are consecutive views of; None when they
    are separate allocations (then copies loop over the layers)."""
    first = layers[0]
    storage = first.untyped_storage().data_ptr()
    step = first.numel()
    for index, layer in enumerate(layers):
        if (
            not layer.is_contiguous()
            or layer.shape != first.shape
            or layer.untyped_storage().data_ptr() != storage
            or layer.storage_offset() != first.storage_offset() + index * step
        ):
            return None
    return first.as_strided((len(layers), *first.shape), (step, *first.stride()),
                            first.storage_offset())


class KVCopier:
    """Copies blocks between the device KV caches (one [2, blocks, ...] tensor per layer) and
    the block-major host pool ([host blocks, layers, 2, ...])."""

    def __init__(
        self, host_pool: torch.Tensor, device: torch.device, staging_bytes: int = STAGING_BYTES
    ) -> None:
        self.host_pool = as_words(host_pool)
        self.num_host_blocks = host_pool.shape[0]
        # Every layer, K and V.
        self.block_bytes = self.host_pool[0].numel() * self.host_pool.element_size()
        self.device = device
        self.is_cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.is_cuda else None
        self.staging: torch.Tensor | None = None
        self.staging_blocks = max(1, staging_bytes // self.block_bytes)
        if self.is_cuda:
            self.staging = torch.empty(
                (self.staging_blocks, *self.host_pool.shape[1:]),
                dtype=self.host_pool.dtype,
                device=device,
            )
        # The end of the latest copies that no forward has waited for yet.
        self._last_copies_end: torch.cuda.Event | None = None
        # (start, end, is a load) events of copies whose device time is not counted yet.
        self._timed: list[tuple[torch.cuda.Event, torch.cuda.Event, bool]] = []
        self._stats = KVTransferStats()
        # The device caches' byte views and their stacked view, made once per caches list (the
        # worker keeps one for its life): 2 x num_layers views a step cost ~100 us of host.
        self._layers_of: tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor | None] | None
        self._layers_of = None

    @property
    def is_idle(self) -> bool:
        """No copy issued that a forward has not waited for, and none whose time or bytes are
        still to report: a step without KV operations may skip the copier."""
        return self._last_copies_end is None and not self._timed and not (
            self._stats.bytes_to_host or self._stats.bytes_to_device or self._stats.copy_seconds
        )

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

        An operation with bad ids copies nothing (they are checked before any copy starts); one
        whose copy raises (say, out of memory for its staging) may have issued part of its
        copies, which is harmless: the scheduler frees its blocks, and the ordering rule keeps
        them from being reused under the copies still queued. A device failure is raised."""
        if not operations:
            return [], {}
        done: list[int] = []
        failed: dict[int, str] = {}
        layers, stacked = self._byte_views(device_caches)
        num_device_blocks = layers[0].shape[1]
        compute = None
        if self.is_cuda:
            assert self.stream is not None
            compute = torch.cuda.current_stream(self.device)
            self.stream.wait_stream(compute)
        with torch.cuda.stream(self.stream) if self.is_cuda else _no_stream():
            for operation in operations:
                try:
                    self._check(operation, num_device_blocks)
                    self._timed_copy(operation, layers, stacked)
                except Exception as error:  # an operation fails alone; the step goes on
                    if _is_device_failure(error):
                        raise  # the device itself is in doubt: an engine fault
                    failed[operation.op_id] = f"{type(error).__name__}: {error}"
                    continue
                done.append(operation.op_id)
                if operation.before_forward and compute is not None:
                    # This step rewrites the blocks: its forward waits for this copy (and
                    # those issued before it on the side stream).
                    compute.wait_stream(self.stream)
        if self.is_cuda:
            # After every copy issued, a failed operation's partial ones included: the next
            # forward waits for this.
            end = torch.cuda.Event()
            end.record(self.stream)
            self._last_copies_end = end
        return done, failed

    def _byte_views(
        self, device_caches: list[torch.Tensor]
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        """The caches as bytes per layer, and as one [layers, ...] tensor when they are views of
        one; checked against the host pool's layout once per caches list."""
        made = self._layers_of
        if (
            made is not None
            and made[0] is device_caches
            and len(made[1]) == len(device_caches)
            and made[1][0].data_ptr() == device_caches[0].data_ptr()
        ):
            return made[1], made[2]
        layers = [cache.view(self.host_pool.dtype) for cache in device_caches]
        if tuple(layers[0][:, 0].shape) != tuple(self.host_pool.shape[2:]) or len(layers) != (
            self.host_pool.shape[1]
        ):
            raise ValueError("the host KV pool does not match the device caches' block layout")
        stacked = stacked_layers(layers)
        self._layers_of = (device_caches, layers, stacked)
        return layers, stacked

    def _timed_copy(
        self, operation: KVOperation, layers: list[torch.Tensor], stacked: torch.Tensor | None
    ) -> None:
        """One operation's copies, timed with events on the side stream (wall time on the
        CPU, where they are synchronous)."""
        is_load = operation.kind == KV_LOAD
        num_bytes = len(operation.source_block_ids) * self.block_bytes
        start = None
        if self.is_cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
        started = time.perf_counter()
        if is_load:
            self._load(operation.source_block_ids, operation.target_block_ids, layers, stacked)
            self._stats.bytes_to_device += num_bytes
        else:
            self._store(operation.source_block_ids, operation.target_block_ids, layers, stacked)
            self._stats.bytes_to_host += num_bytes
        if start is None:
            seconds = time.perf_counter() - started
            self._stats.copy_seconds += seconds
            if is_load:
                self._stats.load_seconds += seconds
            return
        end = torch.cuda.Event(enable_timing=True)
        end.record(self.stream)
        self._timed.append((start, end, is_load))

    def take_stats(self) -> KVTransferStats | None:
        """What the copies moved since the last call (device time only of copies seen done)."""
        still_running = []
        for start, end, is_load in self._timed:
            if end.query():
                seconds = start.elapsed_time(end) / 1000.0
                self._stats.copy_seconds += seconds
                if is_load:
                    self._stats.load_seconds += seconds
            else:
                still_running.append((start, end, is_load))
        self._timed = still_running
        stats = self._stats
        if not (stats.bytes_to_host or stats.bytes_to_device or stats.copy_seconds):
            return None
        self._stats = KVTransferStats()
        return stats

    # ----- the copies ----------------------------------------------------------------------

    def _check(self, operation: KVOperation, num_device_blocks: int) -> None:
        if operation.kind == KV_STORE:
            num_sources, num_targets = num_device_blocks, self.num_host_blocks
        elif operation.kind == KV_LOAD:
            num_sources, num_targets = self.num_host_blocks, num_device_blocks
        else:
            raise ValueError(f"KV operation kind {operation.kind!r} is not store or load")
        if len(operation.source_block_ids) != len(operation.target_block_ids):
            raise ValueError(
                f"a KV copy needs as many target blocks as source blocks, got "
                f"{len(operation.source_block_ids)} and {len(operation.target_block_ids)}"
            )
        for name, ids, bound in (
            ("source_block_ids", operation.source_block_ids, num_sources),
            ("target_block_ids", operation.target_block_ids, num_targets),
        ):
            bad = [block_id for block_id in ids if not 0 <= block_id < bound]
            if bad:
                raise ValueError(f"{name} {bad[:4]} outside [0, {bound}) for a {operation.kind}")
        if operation.kind == KV_LOAD and 0 in operation.target_block_ids:
            raise ValueError("target_block_ids: a load may not write the null block 0")

    def _index(self, block_ids: list[int]) -> torch.Tensor:
        if not self.is_cuda:
            return torch.tensor(block_ids, dtype=torch.long)
        # Made pinned (not pinned after), so the upload is asynchronous on the side stream.
        index = torch.tensor(block_ids, dtype=torch.long, pin_memory=True)
        return index.to(self.device, non_blocking=True)

    def _store(self, device_ids: list[int], host_ids: list[int], layers: list[torch.Tensor],
               stacked: torch.Tensor | None) -> None:
        if not self.is_cuda:
            source, target = self._index(device_ids), self._index(host_ids)
            if stacked is not None:
                gathered = stacked.index_select(2, source).permute(2, 0, 1, 3, 4, 5)
                self.host_pool.index_copy_(0, target, gathered)
                return
            for number, layer in enumerate(layers):
                self.host_pool[:, number].index_copy_(
                    0, target, layer.index_select(1, source).transpose(0, 1)
                )
            return
        staging = self.staging
        assert staging is not None
        for first in range(0, len(device_ids), self.staging_blocks):
            chunk_ids = device_ids[first : first + self.staging_blocks]
            count = len(chunk_ids)
            source = self._index(chunk_ids)
            if stacked is not None:
                staging[:count].copy_(stacked.index_select(2, source).permute(2, 0, 1, 3, 4, 5))
            else:
                for number, layer in enumerate(layers):
                    staging[:count, number].copy_(layer.index_select(1, source).transpose(0, 1))
            chunk_hosts = host_ids[first : first + count]
            for staged, host, length in block_runs(list(range(count)), chunk_hosts):
                # One DMA moves these blocks' KV of every layer.
                self.host_pool[host : host + length].copy_(
                    staging[staged : staged + length], non_blocking=True
                )

    def _load(self, host_ids: list[int], device_ids: list[int], layers: list[torch.Tensor],
              stacked: torch.Tensor | None) -> None:
        if not self.is_cuda:
            source, target = self._index(host_ids), self._index(device_ids)
            fetched = self.host_pool.index_select(0, source)  # [n, layers, 2, ...]
            if stacked is not None:
                stacked.index_copy_(2, target, fetched.permute(1, 2, 0, 3, 4, 5))
                return
            for number, layer in enumerate(layers):
                layer.index_copy_(1, target, fetched[:, number].transpose(0, 1))
            return
        staging = self.staging
        assert staging is not None
        for first in range(0, len(host_ids), self.staging_blocks):
            chunk_hosts = host_ids[first : first + self.staging_blocks]
            count = len(chunk_hosts)
            for staged, host, length in block_runs(list(range(count)), chunk_hosts):
                staging[staged : staged + length].copy_(
                    self.host_pool[host : host + length], non_blocking=True
                )
            target = self._index(device_ids[first : first + count])
            if stacked is not None:
                stacked.index_copy_(2, target, staging[:count].permute(1, 2, 0, 3, 4, 5))
            else:
                for number, layer in enumerate(layers):
                    layer.index_copy_(1, target, staging[:count, number].transpose(0, 1))


def _is_device_failure(error: BaseException) -> bool:
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return True
    return "CUDA error" in str(error) or "illegal memory" in str(error)


class _no_stream:
    """A do-nothing context manager (the CPU has no streams)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        return None


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
