"""FreeBlockQueue: the free KV blocks in eviction order, as an intrusive doubly linked list.

The head is the least recently freed block, the next to be handed out (and so to lose its cached
hash). A prefix-cache hit on a free block must pull it out of the middle of the queue, which a
deque cannot do in O(1); links stored on the blocks themselves can.

A look-ahead cursor walks the queue from the head (look_ahead): the KV host tier writes back
the cached blocks that come within a window of the head, so their copies overlap earlier steps
instead of the step that reuses them. The cursor only moves over blocks it has not seen, so the
walk costs O(1) per block that joins the window, nothing per step when none does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(eq=False, slots=True)
class KVBlock:
    """One block of the paged KV cache: block_size token slots in every layer's KV tensors.

    ref_count counts the requests holding the block; at 0 it sits in the free queue, and if it
    has a block_hash its KV stays reusable by a prefix hit until the block is handed out again.
    Invariant: block_hash is not None exactly when the pool's hash map points at this block.
    """

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    # Free-queue links; None while the block is in use. Left out of repr, which would otherwise
    # walk the whole list.
    prev_free: KVBlock | None = field(default=None, repr=False)
    next_free: KVBlock | None = field(default=None, repr=False)
    # Whether the look-ahead cursor has passed this block since it joined the free queue.
    looked_ahead: bool = field(default=False, repr=False)
    # Freed by a preempted request that recomputes: its KV is not worth a host copy (the KV
    # host tier skips it) until a prefix hit uses it again or it is handed out.
    skip_write_back: bool = field(default=False, repr=False)


class FreeBlockQueue:
    """O(1) popleft / append / remove-from-the-middle over KVBlock.prev_free / next_free."""

    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        # Sentinels at both ends mean no operation has to special-case an empty list or an end.
        self._head = KVBlock(block_id=-1)
        self._tail = KVBlock(block_id=-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self.num_free_blocks = 0
        # The last block look_ahead returned (the head sentinel: none), and how many blocks lie
        # from the head through it: exactly the free blocks with looked_ahead set.
        self._cursor = self._head
        self.num_looked_ahead = 0
        self.append_n(blocks)

    def popleft(self) -> KVBlock:
        """Take the block at the head (least recently freed). ValueError when empty."""
        if self.num_free_blocks == 0:
            raise ValueError("no free KV blocks left")
        block = self._head.next_free
        assert block is not None
        self.remove(block)
        return block

    def popleft_n(self, num_blocks: int) -> list[KVBlock]:
        """Take num_blocks blocks from the head, in order. ValueError (taking none) if too few."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(
                f"asked for {num_blocks} free KV blocks, only {self.num_free_blocks} left"
            )
        return [self.popleft() for _ in range(num_blocks)]

    def remove(self, block: KVBlock) -> None:
        """Unlink a block from wherever it sits in the queue."""
        prev_block, next_block = block.prev_free, block.next_free
        if prev_block is None or next_block is None:
            raise ValueError(f"KV block {block.block_id} is not in the free queue")
        if block.looked_ahead:
            block.looked_ahead = False
            self.num_looked_ahead -= 1
            if block is self._cursor:
                self._cursor = prev_block
        prev_block.next_free = next_block
        next_block.prev_free = prev_block
        block.prev_free = block.next_free = None
        self.num_free_blocks -= 1

    def append(self, block: KVBlock) -> None:
        """Put a block at the tail: it will be the last to be handed out."""
        if block.prev_free is not None or block.next_free is not None:
            raise ValueError(f"KV block {block.block_id} is already in the free queue")
        last = self._tail.prev_free
        assert last is not None
        last.next_free = block
        block.prev_free = last
        block.next_free = self._tail
        self._tail.prev_free = block
        self.num_free_blocks += 1

    def append_n(self, blocks: Iterable[KVBlock]) -> None:
        """Append blocks at the tail in the given order."""
        for block in blocks:
            self.append(block)

    def look_ahead(self, window: int) -> list[KVBlock]:
        """The free blocks that came within `window` blocks of the head since the last call,
        head first: those the next window allocations would hand out, not returned before
        (unless they left the queue and came back)."""
        joined = []
        cursor = self._cursor
        while self.num_looked_ahead < window:
            block = cursor.next_free
            if block is self._tail or block is None:
                break
            block.looked_ahead = True
            self.num_looked_ahead += 1
            joined.append(block)
            cursor = block
        self._cursor = cursor
        return joined

    def get_all_free_blocks(self) -> list[KVBlock]:
        """Every free block, head first. O(n): for tests and debugging."""
        blocks = []
        block = self._head.next_free
        while block is not self._tail:
            assert block is not None
            blocks.append(block)
            block = block.next_free
        return blocks
