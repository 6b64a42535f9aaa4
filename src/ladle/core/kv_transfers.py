"""KVTransfers: the copies between the device pool and the host tier that the scheduler ordered.

Two kinds (protocol/step.py KVOperation):
- a store (write-back): a cached device block is copied to a host block before the device pool
  hands it out again. Not as soon as it is cached: a block that is reused on the device, or
  never evicted, never needs a host copy, and writing every block back cost S1 (nothing hits)
  0.84x of its throughput on an H200 (docs/benchmarks.md). Instead, once per plan, the free
  blocks that came within `window` blocks of the free queue's head (the next to be handed out)
  are stored (write_back_ahead): their copies run beside the next steps' forwards, and the
  step that reuses a block waits for nothing. A cached block the pool hands out before the
  look-ahead saw it (a window too small for a burst of allocations) is stored at eviction
  (store_evicted), in an operation that step's forward waits for (before_forward). The device
  block holds no reference for its store: the worker's ordering (KVOperation) keeps its KV
  until the copy has read it. The host block is not a hit until the store is done.
- a load: a waiting request's prefix that missed on the device but hit the host is copied into
  fresh device blocks; the host blocks are pinned until the load is done.

Operations queue here until the next plan takes them (take_operations). The worker reports each
op id done or failed in a StepResult; finish() settles the blocks on both sides. A failed copy
frees what it held on both sides and forgets the host copy; a cancelled load (its request was
aborted) is forgotten at once: the worker's ordering (KVOperation) makes that safe.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from ladle.core.block_pool import BlockPool, KVBlock
from ladle.core.host_tier import HostBlock, HostTier
from ladle.protocol.step import KV_LOAD, KV_STORE, KVOperation


@dataclass
class PendingStore:
    host_blocks: list[HostBlock]


@dataclass
class PendingLoad:
    request_id: str
    device_blocks: list[KVBlock]  # fresh blocks the load writes (not yet in the hash map)
    host_blocks: list[HostBlock]
    block_hashes: list[int]


@dataclass
class TransferCounts:
    """Blocks moved each way (the engine turns them into bytes for /metrics)."""

    num_blocks_stored: int = 0
    num_blocks_loaded: int = 0
    num_stores_dropped: int = 0  # write-backs refused by a full (pinned) host tier
    num_failed_ops: int = 0
    # Stores at eviction that the step reusing their blocks had to wait for (the look-ahead
    # window missed them): a measure of how well the window is sized.
    num_blocks_stored_at_eviction: int = 0


@dataclass
class FinishedLoads:
    """What finish() learned about loads: requests whose prefix is now on the device, and
    requests whose load failed (they recompute)."""

    loaded: dict[str, int] = field(default_factory=dict)  # request id -> blocks loaded
    failed: list[str] = field(default_factory=list)


def write_back_window(max_num_batched_tokens: int, max_num_seqs: int, block_size: int) -> int:
    """Blocks one step may allocate at most: its whole token budget in blocks, plus a partial
    block and a lookahead (speculative) block for each sequence. A step that allocates more
    (preemption cycles) has its blocks beyond the window stored at eviction instead."""
    return -(-max_num_batched_tokens // block_size) + 2 * max_num_seqs


class KVTransfers:
    """window: how many blocks from the free queue's head write_back_ahead covers, at least
    what one step may allocate (None: the whole pool, so every freed block is stored at the
    next plan)."""

    def __init__(self, block_pool: BlockPool, host_tier: HostTier, window: int | None = None):
        if window is not None and window < 0:
            raise ValueError(f"the write-back window must be >= 0 blocks, got {window}")
        self.block_pool = block_pool
        self.host_tier = host_tier
        self.window = block_pool.num_blocks if window is None else window
        block_pool.on_evict = self.store_evicted
        self._op_ids = itertools.count(1)
        # (device block id, host block) of the stores ordered since the last plan: ahead of
        # eviction, and at eviction (the next forward waits for those).
        self._stores_to_issue: list[tuple[int, HostBlock]] = []
        self._evicted_stores_to_issue: list[tuple[int, HostBlock]] = []
        self._loads_to_issue: list[KVOperation] = []
        self._in_flight: dict[int, PendingStore | PendingLoad] = {}
        self._load_op_by_request: dict[str, int] = {}
        self.counts = TransferCounts()

    @property
    def num_in_flight(self) -> int:
        """Operations issued or queued and not settled yet."""
        return (
            len(self._in_flight)
            + len(self._stores_to_issue)
            + len(self._evicted_stores_to_issue)
            + len(self._loads_to_issue)
        )

    def is_loading(self, request_id: str) -> bool:
        return request_id in self._load_op_by_request

    # ----- ordering copies -----------------------------------------------------------------

    def write_back_ahead(self) -> None:
        """Store the cached free blocks that came within the window of the free queue's head
        since the last call (O(1) a block, nothing when none did)."""
        for block in self.block_pool.free_block_queue.look_ahead(self.window):
            if block.block_hash is not None and not block.skip_write_back:
                self._store(block.block_id, block.block_hash, self._stores_to_issue)

    def store_evicted(self, block: KVBlock, block_hash: int) -> None:
        """The pool hands out a cached block now (BlockPool.on_evict): store it unless the host
        has its hash, in an operation this step's forward waits for (it rewrites the block)."""
        if self._store(block.block_id, block_hash, self._evicted_stores_to_issue):
            self.counts.num_blocks_stored_at_eviction += 1

    def _store(self, block_id: int, block_hash: int, queue: list[tuple[int, HostBlock]]) -> bool:
        """Order a write-back of a full, computed, cached device block; False when the host
        has the hash already, or a full host tier drops it."""
        tier = self.host_tier
        if tier.contains(block_hash):
            return False
        host_block = tier.allocate_for_store(block_hash)
        if host_block is None:
            self.counts.num_stores_dropped += 1
            return False
        queue.append((block_id, host_block))
        return True

    def load(
        self,
        request_id: str,
        device_blocks: list[KVBlock],
        host_blocks: list[HostBlock],
    ) -> None:
        """Copy host_blocks into device_blocks (fresh, held by the request) for its prefill."""
        if request_id in self._load_op_by_request:
            raise ValueError(f"request {request_id} is already loading KV")
        self.host_tier.pin(host_blocks)
        op_id = next(self._op_ids)
        hashes = [block.block_hash for block in host_blocks]
        assert all(h is not None for h in hashes)
        self._in_flight[op_id] = PendingLoad(request_id, device_blocks, host_blocks, hashes)
        self._load_op_by_request[request_id] = op_id
        self._loads_to_issue.append(
            KVOperation(
                KV_LOAD,
                source_block_ids=[block.block_id for block in host_blocks],
                target_block_ids=[block.block_id for block in device_blocks],
                op_id=op_id,
            )
        )

    def take_operations(self) -> list[KVOperation]:
        """The copies the next plan carries, after looking ahead in the free queue: the stores
        at eviction (one operation, the forward waits for it), the stores ahead of eviction
        (one operation, so the worker batches them), then each load."""
        self.write_back_ahead()
        operations = []
        for queue, before_forward in (
            (self._evicted_stores_to_issue, True),
            (self._stores_to_issue, False),
        ):
            if not queue:
                continue
            op_id = next(self._op_ids)
            host_blocks = [host for _, host in queue]
            self._in_flight[op_id] = PendingStore(host_blocks)
            operations.append(
                KVOperation(
                    KV_STORE,
                    source_block_ids=[block_id for block_id, _ in queue],
                    target_block_ids=[block.block_id for block in host_blocks],
                    op_id=op_id,
                    before_forward=before_forward,
                )
            )
            queue.clear()
        if self._loads_to_issue:
            operations += self._loads_to_issue
            self._loads_to_issue = []
        return operations

    # ----- settling ------------------------------------------------------------------------

    def finish(self, done_ids: list[int], failed: dict[int, str]) -> FinishedLoads:
        """Settle the operations a StepResult reports; unknown ids (cancelled) are ignored."""
        finished = FinishedLoads()
        for op_id in [*done_ids, *failed]:
            pending = self._in_flight.pop(op_id, None)
            if pending is None:
                continue
            ok = op_id not in failed
            if not ok:
                self.counts.num_failed_ops += 1
            if isinstance(pending, PendingStore):
                self._finish_store(pending, ok)
            else:
                del self._load_op_by_request[pending.request_id]
                self._finish_load(pending, ok)
                if ok:
                    finished.loaded[pending.request_id] = len(pending.device_blocks)
                else:
                    finished.failed.append(pending.request_id)
        return finished

    def cancel_load(self, request_id: str) -> None:
        """Forget a request's load (it was aborted or preempted while waiting): the host blocks
        are unpinned now; the caller frees the device blocks with the request's."""
        op_id = self._load_op_by_request.pop(request_id, None)
        if op_id is None:
            return
        queued = [op for op in self._loads_to_issue if op.op_id == op_id]
        for op in queued:
            self._loads_to_issue.remove(op)
        pending = self._in_flight.pop(op_id)
        assert isinstance(pending, PendingLoad)
        self.host_tier.unpin(pending.host_blocks)

    def _finish_store(self, pending: PendingStore, ok: bool) -> None:
        for host_block in pending.host_blocks:
            if ok:
                self.host_tier.store_done(host_block)
                self.counts.num_blocks_stored += 1
            else:
                self.host_tier.drop(host_block)

    def _finish_load(self, pending: PendingLoad, ok: bool) -> None:
        self.host_tier.unpin(pending.host_blocks)
        if not ok:
            # The host copy is suspect: forget it, so no one else loads it.
            for host_block in pending.host_blocks:
                if host_block.ref_count == 0 and host_block.block_hash is not None:
                    self.host_tier.drop(host_block)
            return
        self.counts.num_blocks_loaded += len(pending.device_blocks)
        pool = self.block_pool
        for block, block_hash in zip(pending.device_blocks, pending.block_hashes):
            # The device blocks now hold these hashes' KV: device hits from here on. A hash that
            # some other request computed meanwhile keeps its block; this one stays uncached.
            pool.register_cached_block(block, block_hash)
