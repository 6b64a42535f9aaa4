"""FreeBlockQueue and BlockPool: exact block ids, ref counts, LRU order, the hash map."""

from __future__ import annotations

import pytest
from request_factory import make_request

from ladle.core.block_hash import extend_block_hashes
from ladle.core.block_pool import BlockPool
from ladle.core.free_block_queue import FreeBlockQueue, KVBlock


def ids(blocks: list[KVBlock]) -> list[int]:
    return [block.block_id for block in blocks]


# ---- FreeBlockQueue ----


def make_queue(num_blocks: int) -> tuple[FreeBlockQueue, list[KVBlock]]:
    blocks = [KVBlock(block_id) for block_id in range(num_blocks)]
    return FreeBlockQueue(blocks), blocks


def test_queue_keeps_insertion_order():
    queue, _ = make_queue(5)
    assert queue.num_free_blocks == 5
    assert ids(queue.get_all_free_blocks()) == [0, 1, 2, 3, 4]


def test_queue_popleft_and_popleft_n():
    queue, _ = make_queue(5)
    assert queue.popleft().block_id == 0
    assert ids(queue.popleft_n(3)) == [1, 2, 3]
    assert queue.num_free_blocks == 1
    assert ids(queue.popleft_n(0)) == []
    with pytest.raises(ValueError):
        queue.popleft_n(2)
    assert queue.num_free_blocks == 1  # a refused popleft_n takes nothing
    queue.popleft()
    with pytest.raises(ValueError):
        queue.popleft()


def test_queue_remove_from_middle_head_and_tail():
    queue, blocks = make_queue(5)
    queue.remove(blocks[2])
    assert ids(queue.get_all_free_blocks()) == [0, 1, 3, 4]
    queue.remove(blocks[0])
    queue.remove(blocks[4])
    assert ids(queue.get_all_free_blocks()) == [1, 3]
    assert queue.num_free_blocks == 2
    assert blocks[2].prev_free is None and blocks[2].next_free is None


def test_queue_remove_twice_is_an_error():
    queue, blocks = make_queue(3)
    queue.remove(blocks[1])
    with pytest.raises(ValueError):
        queue.remove(blocks[1])


def test_queue_append_goes_to_tail():
    queue, blocks = make_queue(4)
    taken = queue.popleft_n(2)
    queue.append(taken[1])
    queue.append_n([taken[0]])
    assert ids(queue.get_all_free_blocks()) == [2, 3, 1, 0]
    assert queue.num_free_blocks == 4
    with pytest.raises(ValueError):
        queue.append(blocks[2])  # already in the queue


def test_queue_empty_then_refilled():
    queue, blocks = make_queue(2)
    queue.popleft_n(2)
    assert queue.get_all_free_blocks() == []
    queue.append_n(reversed(blocks))
    assert ids(queue.get_all_free_blocks()) == [1, 0]


def test_block_repr_does_not_walk_links():
    queue, blocks = make_queue(1000)
    assert "prev_free" not in repr(blocks[500])


# ---- BlockPool ----


def test_pool_reserves_the_null_block():
    pool = BlockPool(num_blocks=5, enable_caching=True)
    assert pool.null_block.block_id == 0
    assert pool.num_usable_blocks == 4
    assert pool.num_free_blocks == 4
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [1, 2, 3, 4]
    assert ids(pool.get_new_blocks(4)) == [1, 2, 3, 4]
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)  # block 0 is never handed out


def test_pool_too_small():
    with pytest.raises(ValueError):
        BlockPool(num_blocks=1, enable_caching=True)


def test_pool_new_blocks_ref_count_and_usage():
    pool = BlockPool(num_blocks=5, enable_caching=True)
    blocks = pool.get_new_blocks(3)
    assert ids(blocks) == [1, 2, 3]
    assert [block.ref_count for block in blocks] == [1, 1, 1]
    assert pool.num_free_blocks == 1
    assert pool.usage == pytest.approx(0.75)
    with pytest.raises(ValueError):
        pool.get_new_blocks(2)
    assert pool.num_free_blocks == 1  # a refused request takes nothing


def test_pool_touch_and_free_ref_counts():
    pool = BlockPool(num_blocks=5, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.touch(blocks)
    assert [block.ref_count for block in blocks] == [2, 2]
    pool.free_blocks(blocks)
    assert pool.num_free_blocks == 2  # still held once
    pool.free_blocks(reversed(blocks))
    assert [block.ref_count for block in blocks] == [0, 0]
    # Freed in the given order onto the tail.
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [3, 4, 2, 1]
    with pytest.raises(ValueError):
        pool.free_blocks([blocks[0]])  # double free


def test_pool_touch_revives_a_free_block():
    pool = BlockPool(num_blocks=5, enable_caching=True)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(blocks)
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [3, 4, 1, 2]
    pool.touch([blocks[0]])
    assert blocks[0].ref_count == 1
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [3, 4, 2]


def cached_request_blocks(pool: BlockPool, block_size: int = 4):
    """A request of 2 full blocks + 1 token, its 3 blocks allocated and the 2 full ones cached."""
    request = make_request("r", list(range(2 * block_size + 1)))
    extend_block_hashes(request, block_size)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(request, blocks, num_cached_blocks=0, num_full_blocks=2)
    return request, blocks


def test_pool_cache_full_blocks_registers_hashes():
    pool = BlockPool(num_blocks=6, enable_caching=True)
    request, blocks = cached_request_blocks(pool)
    assert len(request.block_hashes) == 2
    assert pool.get_cached_block(request.block_hashes[0]) is blocks[0]
    assert pool.get_cached_block(request.block_hashes[1]) is blocks[1]
    assert blocks[0].block_hash == request.block_hashes[0]
    assert blocks[2].block_hash is None  # the partial block is never cached
    assert len(pool.cached_block_by_hash) == 2
    with pytest.raises(ValueError):
        pool.cache_full_blocks(request, blocks, 2, 3)  # no hash for the partial block


def test_pool_cache_keeps_the_existing_entry_for_a_duplicate():
    pool = BlockPool(num_blocks=8, enable_caching=True)
    request, blocks = cached_request_blocks(pool)
    twin = make_request("twin", request.all_token_ids)
    extend_block_hashes(twin, 4)
    twin_blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(twin, twin_blocks, 0, 2)
    assert pool.get_cached_block(request.block_hashes[0]) is blocks[0]
    assert twin_blocks[0].block_hash is None
    assert len(pool.cached_block_by_hash) == 2


def test_pool_free_cached_block_stays_a_hit_until_reused():
    pool = BlockPool(num_blocks=4, enable_caching=True)
    request, blocks = cached_request_blocks(pool)
    pool.free_blocks(reversed(blocks))
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [3, 2, 1]
    assert pool.get_cached_block(request.block_hashes[0]) is blocks[0]
    # Handing out the head (block 3, uncached) evicts nothing; then block 2 loses its hash.
    assert ids(pool.get_new_blocks(2)) == [3, 2]
    assert pool.get_cached_block(request.block_hashes[1]) is None
    assert blocks[1].block_hash is None
    assert pool.get_cached_block(request.block_hashes[0]) is blocks[0]
    assert len(pool.cached_block_by_hash) == 1


def test_pool_without_caching_registers_nothing():
    pool = BlockPool(num_blocks=6, enable_caching=False)
    request, blocks = cached_request_blocks(pool)
    assert pool.cached_block_by_hash == {}
    assert pool.get_cached_block(request.block_hashes[0]) is None


def test_pool_reset_prefix_cache():
    pool = BlockPool(num_blocks=6, enable_caching=True)
    request, blocks = cached_request_blocks(pool)
    assert pool.reset_prefix_cache() is False  # blocks in use
    assert len(pool.cached_block_by_hash) == 2
    pool.free_blocks(blocks)
    assert pool.reset_prefix_cache() is True
    assert pool.cached_block_by_hash == {}
    assert all(block.block_hash is None for block in pool.blocks)
    assert pool.get_cached_block(request.block_hashes[0]) is None
