"""HostTier: the second tier of the KV cache, blocks in host memory keyed by chained block hashes.

The device pool (block_pool.py) is the first tier. A block enters the host tier when it becomes
full and computed on the device (a write-back, scheduled by kv_cache_manager.py); from then on
the device pool may evict it for free, and a later prefix lookup that misses on the device but
hits here copies it back (a load). Because the hash covers the whole prefix and any salt, a host
hit means exactly what a device hit means.

Bookkeeping only (no tensors, no torch): host block ids index the worker's host pool.

LRU: the entries sit in an OrderedDict, least recently used first. An entry moves to the end when
it is stored, when a load reads it, and when a device hit uses the same hash (kv_cache_manager
touches it), so the host evicts the block least recently used in either tier. Entries a load is
reading (ref_count > 0) or whose store has not completed are never evicted; a store that finds
no evictable block is dropped, which is today's behaviour without a host tier, never an error.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass


@dataclass(eq=False, slots=True)
class HostBlock:
    """One block of the host pool. ref_count counts loads in flight that read it; is_ready is
    False while its store is in flight (a lookup must not hit a block whose copy may fail)."""

    block_id: int
    block_hash: int | None = None
    ref_count: int = 0
    is_ready: bool = False


class HostTier:
    """num_blocks host blocks: free ones, and cached ones in LRU order by hash."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the host tier needs num_blocks >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [HostBlock(block_id) for block_id in range(num_blocks)]
        self._free: deque[HostBlock] = deque(self.blocks)
        self._by_hash: OrderedDict[int, HostBlock] = OrderedDict()
        # Blocks a copy is using (read by a load, or written by a store): kept as a count, since
        # the engine reads the usage after every step.
        self._num_pinned = 0

    @property
    def num_used_blocks(self) -> int:
        """Blocks holding (or being written with) some hash's KV."""
        return self.num_blocks - len(self._free)

    @property
    def num_pinned_blocks(self) -> int:
        """Blocks no eviction may take now: read by a load, or written by a store."""
        return self._num_pinned

    @property
    def usage(self) -> float:
        """Fraction of host blocks a copy is using now, in [0, 1]: like the device pool's
        usage (blocks held by requests), it returns to 0 when nothing is in flight; cached
        blocks are num_used_blocks."""
        return self.num_pinned_blocks / self.num_blocks

    def contains(self, block_hash: int) -> bool:
        """Whether the hash has an entry here, its store completed or not."""
        return block_hash in self._by_hash

    def lookup(self, block_hash: int) -> HostBlock | None:
        """The ready block holding this hash's KV; None on a miss (or a store still in flight)."""
        block = self._by_hash.get(block_hash)
        return block if block is not None and block.is_ready else None

    def touch(self, block_hash: int) -> None:
        """Mark the hash's entry most recently used (a hit in either tier); no-op on a miss."""
        if block_hash in self._by_hash:
            self._by_hash.move_to_end(block_hash)

    def allocate_for_store(self, block_hash: int) -> HostBlock | None:
        """A block to write this hash into, entered as most recently used and not yet ready.

        None when the hash is here already, or every block is pinned (the write-back is
        dropped). Takes a free block first, else evicts the least recently used evictable one.
        """
        if block_hash in self._by_hash:
            return None
        block = self._free.popleft() if self._free else self._evict_one()
        if block is None:
            return None
        block.block_hash = block_hash
        block.is_ready = False
        self._by_hash[block_hash] = block
        self._num_pinned += 1  # being written
        return block

    def store_done(self, block: HostBlock) -> None:
        if block.is_ready:
            return
        block.is_ready = True
        if block.ref_count == 0:
            self._num_pinned -= 1

    def pin(self, blocks: list[HostBlock]) -> None:
        """A load starts reading these blocks: they stay until unpin."""
        for block in blocks:
            if block.ref_count == 0 and block.is_ready:
                self._num_pinned += 1
            block.ref_count += 1
            if block.block_hash is not None:
                self._by_hash.move_to_end(block.block_hash)

    def unpin(self, blocks: list[HostBlock]) -> None:
        for block in blocks:
            if block.ref_count <= 0:
                raise ValueError(f"host block {block.block_id} unpinned more often than pinned")
            block.ref_count -= 1
            if block.ref_count == 0 and block.is_ready:
                self._num_pinned -= 1

    def drop(self, block: HostBlock) -> None:
        """Forget a block's KV (its copy failed): the block is free again. Unpin it first."""
        if block.ref_count:
            raise ValueError(f"host block {block.block_id} is read by a load; unpin it first")
        if block.block_hash is not None:
            del self._by_hash[block.block_hash]
            block.block_hash = None
            if not block.is_ready:
                self._num_pinned -= 1  # its store never completed
        block.is_ready = False
        if block.ref_count == 0:
            self._free.append(block)

    def lru_hashes(self) -> list[int]:
        """Every cached hash, least recently used first (tests and debugging)."""
        return list(self._by_hash)

    def reset(self) -> bool:
        """Forget every entry; refused (False) while any copy is in flight."""
        if self.num_pinned_blocks:
            return False
        for block in self._by_hash.values():
            block.block_hash = None
            block.is_ready = False
            self._free.append(block)
        self._by_hash.clear()
        return True

    def _evict_one(self) -> HostBlock | None:
        for block_hash, block in self._by_hash.items():
            if block.ref_count == 0 and block.is_ready:
                del self._by_hash[block_hash]
                block.block_hash = None
                return block
        return None
