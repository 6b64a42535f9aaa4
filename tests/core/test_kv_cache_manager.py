"""KVCacheManager allocation: exact block tables, None when full, every block back when done."""

from __future__ import annotations

import random

import pytest
from request_factory import decode_step, make_request, schedule_prefill

from ladle.core.kv_cache_manager import KVCacheManager

BLOCK_SIZE = 4


def free_ids(manager: KVCacheManager) -> list[int]:
    return [block.block_id for block in manager.block_pool.free_block_queue.get_all_free_blocks()]


def assert_all_free(manager: KVCacheManager) -> None:
    pool = manager.block_pool
    assert manager.num_free_blocks == pool.num_usable_blocks
    assert manager.usage == 0.0
    assert all(block.ref_count == 0 for block in pool.blocks)
    assert sorted(free_ids(manager)) == list(range(1, pool.num_blocks))


def test_helpers():
    manager = KVCacheManager(num_blocks=5, block_size=BLOCK_SIZE)
    assert [manager.num_blocks_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    assert manager.get_block_ids("nobody") == []
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=5, block_size=0)


def test_exact_block_ids_for_a_sequence_of_requests():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE, enable_caching=False)
    first = make_request("a", list(range(10)))  # 3 blocks
    second = make_request("b", list(range(100, 104)))  # exactly 1 block
    assert [b.block_id for b in manager.allocate_slots(first, 10)] == [1, 2, 3]
    assert [b.block_id for b in manager.allocate_slots(second, 4)] == [4]
    assert manager.get_block_ids("a") == [1, 2, 3]
    assert manager.get_block_ids("b") == [4]
    assert manager.num_free_blocks == 5
    assert manager.usage == pytest.approx(4 / 9)


def test_decode_allocates_only_at_block_boundaries():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    request = make_request("a", list(range(6)))
    schedule_prefill(manager, request)
    assert manager.get_block_ids("a") == [1, 2]
    allocated = []
    for token in range(5):
        before = manager.get_block_ids("a")
        assert decode_step(manager, request, 1000 + token)
        allocated.append(manager.get_block_ids("a")[len(before):])
    # Tokens 7 and 8 fill block 2; token 9 opens block 3; 10 and 11 fill it.
    assert allocated == [[], [], [3], [], []]
    assert request.num_computed_tokens == 11


def test_allocate_slots_chunked_prefill():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    request = make_request("a", list(range(10)))
    assert [b.block_id for b in manager.allocate_slots(request, 5)] == [1, 2]
    request.num_computed_tokens = 5
    manager.cache_computed_blocks(request)
    assert [b.block_id for b in manager.allocate_slots(request, 3)] == []  # 8 tokens: 2 blocks
    request.num_computed_tokens = 8
    assert [b.block_id for b in manager.allocate_slots(request, 2)] == [3]
    assert manager.get_block_ids("a") == [1, 2, 3]


def test_allocate_slots_none_changes_nothing():
    manager = KVCacheManager(num_blocks=5, block_size=BLOCK_SIZE)
    holder = make_request("holder", list(range(8)))
    schedule_prefill(manager, holder)  # blocks 1, 2
    request = make_request("big", list(range(100, 113)))  # 13 tokens: 4 blocks, 2 free
    state_before = (manager.num_free_blocks, free_ids(manager), manager.get_block_ids("big"))
    assert manager.allocate_slots(request, 13) is None
    assert (manager.num_free_blocks, free_ids(manager), manager.get_block_ids("big")) == (
        state_before
    )
    assert "big" not in manager._blocks_by_request
    # Exactly what is left still works.
    assert [b.block_id for b in manager.allocate_slots(request, 8)] == [3, 4]
    request.num_computed_tokens = 8
    assert manager.allocate_slots(request, 1) is None
    assert manager.get_block_ids("big") == [3, 4]


def test_allocate_slots_none_counts_revived_hits():
    """A hit on a free cached block leaves the free queue: it cannot also be allocated."""
    manager = KVCacheManager(num_blocks=5, block_size=BLOCK_SIZE)
    first = make_request("a", list(range(9)))  # 2 full blocks + 1 token -> blocks 1, 2, 3
    schedule_prefill(manager, first)
    manager.free(first)
    assert free_ids(manager) == [4, 3, 2, 1]
    # Shares the first 2 blocks (both free but cached), then needs 3 more: 4 free, 2 revived.
    second = make_request("b", list(range(8)) + list(range(50, 59)))
    hits, num_hit = manager.get_computed_blocks(second)
    assert [b.block_id for b in hits] == [1, 2] and num_hit == 8
    assert manager.allocate_slots(second, 9, hits, num_hit) is None
    assert free_ids(manager) == [4, 3, 2, 1]
    assert all(block.ref_count == 0 for block in manager.block_pool.blocks)
    assert manager.get_block_ids("b") == []
    # Two new blocks fit: hits revived, the new ones come from the head (4, then 3 evicted).
    allocated = manager.allocate_slots(second, 8, hits, num_hit)
    assert [b.block_id for b in allocated] == [4, 3]
    assert manager.get_block_ids("b") == [1, 2, 4, 3]
    assert manager.num_free_blocks == 0


def test_prefix_hits_only_for_a_request_without_blocks():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    first = make_request("a", list(range(9)))
    schedule_prefill(manager, first)
    second = make_request("b", list(range(9)))
    hits, num_hit = manager.get_computed_blocks(second)
    manager.allocate_slots(second, 1)
    with pytest.raises(ValueError):
        manager.allocate_slots(second, 1, hits, num_hit)
    with pytest.raises(ValueError):
        manager.allocate_slots(make_request("c", [1]), 1, hits[:1], 5)  # 5 tokens in 1 block


def test_free_returns_blocks_in_reverse_and_is_idempotent():
    manager = KVCacheManager(num_blocks=6, block_size=BLOCK_SIZE, enable_caching=False)
    request = make_request("a", list(range(10)))
    manager.allocate_slots(request, 10)
    assert free_ids(manager) == [4, 5]
    manager.free(request)
    assert free_ids(manager) == [4, 5, 3, 2, 1]
    assert manager.get_block_ids("a") == []
    manager.free(request)  # unknown now: no-op
    manager.free(make_request("never", [1]))
    assert_all_free(manager)


def test_every_block_returns_after_finish_abort_and_preemption():
    manager = KVCacheManager(num_blocks=8, block_size=BLOCK_SIZE)
    shared = list(range(8))
    finished = make_request("finished", shared + [20, 21])
    aborted = make_request("aborted", shared + [30])
    preempted = make_request("preempted", shared + [40, 41, 42])

    assert schedule_prefill(manager, finished) == 0
    assert schedule_prefill(manager, aborted) == 8
    assert schedule_prefill(manager, preempted) == 8
    for token in range(3):
        assert decode_step(manager, finished, 100 + token)
    # Blocks 1, 2 shared by all three; the 13th token of "finished" opens block 6.
    assert manager.get_block_ids("finished") == [1, 2, 3, 6]
    assert manager.get_block_ids("aborted") == [1, 2, 4]
    assert manager.get_block_ids("preempted") == [1, 2, 5]
    assert [manager.block_pool.blocks[i].ref_count for i in (1, 2)] == [3, 3]

    # Preemption: free, reset, then come back and hit the cache for its own full blocks.
    manager.free(preempted)
    preempted.num_computed_tokens = 0
    assert [manager.block_pool.blocks[i].ref_count for i in (1, 2)] == [2, 2]
    manager.free(aborted)  # abort mid-flight
    assert free_ids(manager) == [7, 5, 4]
    assert schedule_prefill(manager, preempted) == 8  # 11 tokens: 2 full blocks, last recomputed
    assert manager.get_block_ids("preempted") == [1, 2, 7]

    manager.free(finished)
    manager.free(preempted)
    assert_all_free(manager)
    assert manager._num_cached_blocks_by_request == {}


def test_preempted_request_reuses_its_own_decoded_blocks():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    request = make_request("a", list(range(6)))
    schedule_prefill(manager, request)
    for token in range(6):
        assert decode_step(manager, request, 500 + token)
    assert manager.get_block_ids("a") == [1, 2, 3]  # 12 tokens, all computed and cached
    manager.free(request)
    request.num_computed_tokens = 0
    hits, num_hit = manager.get_computed_blocks(request)
    # 12 tokens: 3 full blocks, but the last token is recomputed, so 2 blocks hit.
    assert [b.block_id for b in hits] == [1, 2] and num_hit == 8
    assert manager.allocate_slots(request, 4, hits, num_hit) is not None
    # The recomputed 3rd block comes from the queue head (4, never used); block 3, freed after
    # 4..9, keeps the old copy, which stays the cached entry for that hash.
    assert manager.get_block_ids("a") == [1, 2, 4]
    request.num_computed_tokens = 12
    manager.cache_computed_blocks(request)
    third_hash = request.block_hashes[2]
    assert manager.block_pool.get_cached_block(third_hash).block_id == 3
    assert manager.block_pool.blocks[4].block_hash is None


def test_usage_tracks_allocation():
    manager = KVCacheManager(num_blocks=5, block_size=BLOCK_SIZE)
    request = make_request("a", list(range(8)))
    assert manager.usage == 0.0
    schedule_prefill(manager, request)
    assert manager.usage == pytest.approx(0.5)
    manager.free(request)
    assert manager.usage == 0.0


def check_invariants(manager: KVCacheManager) -> None:
    pool = manager.block_pool
    holders = {block.block_id: 0 for block in pool.blocks}
    for request_blocks in manager._blocks_by_request.values():
        for block in request_blocks:
            holders[block.block_id] += 1
    assert {block.block_id: block.ref_count for block in pool.blocks} == holders
    free = {block.block_id for block in pool.free_block_queue.get_all_free_blocks()}
    assert free == {block.block_id for block in pool.blocks[1:] if block.ref_count == 0}
    assert pool.free_block_queue.num_free_blocks == len(free)
    for block_hash, block in pool.cached_block_by_hash.items():
        assert block.block_hash == block_hash
    assert sum(block.block_hash is not None for block in pool.blocks) == len(
        pool.cached_block_by_hash
    )
    assert pool.null_block.ref_count == 0 and pool.null_block.block_hash is None


def test_random_workload_keeps_invariants_and_frees_everything():
    rng = random.Random(0)
    manager = KVCacheManager(num_blocks=24, block_size=BLOCK_SIZE)
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 13))] for _ in range(3)]
    running = []
    for step in range(400):
        action = rng.random()
        if action < 0.3 and len(running) < 6:
            prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 9))]
            request = make_request(f"r{step}", prompt)
            hits, num_hit = manager.get_computed_blocks(request)
            num_new = request.num_tokens - num_hit
            if manager.allocate_slots(request, num_new, hits, num_hit) is not None:
                request.num_computed_tokens = request.num_tokens
                manager.cache_computed_blocks(request)
                running.append(request)
        elif action < 0.85 and running:
            request = rng.choice(running)
            if not decode_step(manager, request, rng.randrange(50)):
                victim = running.pop()  # preempt the newest, as a scheduler would
                manager.free(victim)
                victim.num_computed_tokens = 0
        elif running:
            manager.free(running.pop(rng.randrange(len(running))))  # finish or abort
        check_invariants(manager)
    for request in running:
        manager.free(request)
    check_invariants(manager)
    assert manager.num_free_blocks == manager.block_pool.num_usable_blocks
    assert manager.prefix_cache_hits > 0
