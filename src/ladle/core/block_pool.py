"""BlockPool: every KV block, their ref counts, the prefix-cache hash map and the free queue.

Freed blocks keep their KV and their hash: they stay prefix-cache hits until the free queue hands
them out again, least recently freed first. So the free queue doubles as the cache's LRU order,
and "evicting" a cached block costs nothing beyond forgetting its hash.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from ladle.core.free_block_queue import FreeBlockQueue, KVBlock

if TYPE_CHECKING:
    from ladle.core.request import Request

__all__ = ["BlockPool", "KVBlock"]


class BlockPool:
    """num_blocks KV blocks; block 0 is the null block and never handed out.

    The null block is a harmless target for padding slots (CUDA-graph dummy rows, skipped
    positions), so it is never in the free queue and never cached.
    """

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(block_id) for block_id in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.free_block_queue = FreeBlockQueue(self.blocks[1:])
        # One block per hash: duplicates of a cached block (two requests computing the same prefix
        # in one step) simply stay unregistered and are recycled like any uncached block.
        self.cached_block_by_hash: dict[int, KVBlock] = {}
        # Called with (block, its hash) as get_new_blocks evicts a cached block, before its KV
        # is overwritten (the KV host tier's last chance to write it back); None: no one cares.
        self.on_evict: Callable[[KVBlock, int], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref_count 0, cached or not: what get_new_blocks can hand out."""
        return self.free_block_queue.num_free_blocks

    @property
    def num_usable_blocks(self) -> int:
        """Every block but the null block."""
        return self.num_blocks - 1

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by some request, in [0, 1]."""
        return 1.0 - self.num_free_blocks / self.num_usable_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVBlock]:
        """Take num_blocks blocks from the head of the free queue, each with ref_count 1.

        A block that was cached loses its hash: its KV is about to be overwritten.
        ValueError, taking nothing, when fewer than num_blocks are free.
        """
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            assert block.ref_count == 0, f"free block {block.block_id} has refs"
            self._evict(block)
            block.ref_count = 1
        return blocks

    def get_cached_block(self, block_hash: int) -> KVBlock | None:
        """The block holding the KV of this chained hash, in use or free; None on a miss."""
        return self.cached_block_by_hash.get(block_hash)

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take one more reference on each block (a prefix hit).

        A hit on a free cached block revives it: it leaves the free queue so it cannot be handed
        out, and its KV overwritten, while this request uses it.
        """
        for block in blocks:
            if block.ref_count == 0:
                self.free_block_queue.remove(block)
                block.skip_write_back = False  # used again: worth keeping after all
            block.ref_count += 1

    def free_blocks(self, ordered_blocks: Iterable[KVBlock]) -> None:
        """Drop one reference on each block; those that reach 0 join the free queue's tail.

        The order given is the eviction order among them: the first freed is the first reused.
        """
        for block in ordered_blocks:
            if block.ref_count <= 0:
                raise ValueError(f"KV block {block.block_id} freed more often than taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_block_queue.append(block)

    def cache_full_blocks(
        self,
        request: Request,
        blocks: Sequence[KVBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Register blocks[num_cached_blocks:num_full_blocks] under request.block_hashes.

        The caller guarantees these blocks are full and computed. A hash already mapped to
        another block keeps that entry; this block then stays uncached.
        """
        if not self.enable_caching:
            return
        if num_full_blocks > len(request.block_hashes):
            raise ValueError(
                f"request {request.request_id} has {len(request.block_hashes)} block hashes, "
                f"cannot cache {num_full_blocks} blocks"
            )
        for block_index in range(num_cached_blocks, num_full_blocks):
            block = blocks[block_index]
            if block.block_hash is not None:
                continue  # a prefix hit: already the map's entry for this hash
            block_hash = request.block_hashes[block_index]
            if block_hash not in self.cached_block_by_hash:
                self.cached_block_by_hash[block_hash] = block
                block.block_hash = block_hash

    def register_cached_block(self, block: KVBlock, block_hash: int) -> bool:
        """Enter one block under a hash (its KV was loaded from the host tier). False, leaving
        the block uncached, when the hash already has a block."""
        if block_hash in self.cached_block_by_hash or block.block_hash is not None:
            return False
        self.cached_block_by_hash[block_hash] = block
        block.block_hash = block_hash
        return True

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Refused (False) while any block is in use.

        A block in use by a running request would otherwise lose its entry yet still be
        re-registered later; refusing keeps the hash map and the blocks consistent.
        """
        if self.num_free_blocks != self.num_usable_blocks:
            return False
        for block in self.cached_block_by_hash.values():
            block.block_hash = None
        self.cached_block_by_hash.clear()
        return True

    def _evict(self, block: KVBlock) -> None:
        if block.block_hash is None:
            return
        if self.on_evict is not None and not block.skip_write_back:
            self.on_evict(block, block.block_hash)
        block.skip_write_back = False
        # The invariant (block_hash set only on the map's own entry) makes this a plain delete.
        del self.cached_block_by_hash[block.block_hash]
        block.block_hash = None
