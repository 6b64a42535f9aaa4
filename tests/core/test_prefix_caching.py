"""Prefix caching: chained hashes, hit granularity, sharing, and the exact LRU eviction order."""

from __future__ import annotations

import subprocess
import sys

import pytest
from request_factory import decode_step, make_request, schedule_prefill

from ladle.core.block_hash import extend_block_hashes, hash_block_tokens
from ladle.core.kv_cache_manager import KVCacheManager

BLOCK_SIZE = 4


def free_ids(manager: KVCacheManager) -> list[int]:
    return [block.block_id for block in manager.block_pool.free_block_queue.get_all_free_blocks()]


def ref_counts(manager: KVCacheManager, block_ids: list[int]) -> list[int]:
    return [manager.block_pool.blocks[block_id].ref_count for block_id in block_ids]


def cached_ids(manager: KVCacheManager) -> list[int]:
    return sorted(block.block_id for block in manager.block_pool.cached_block_by_hash.values())


# ---- hashes ----


def test_hash_is_a_stable_64_bit_int():
    value = hash_block_tokens(None, (1, 2, 3, 4))
    assert isinstance(value, int) and 0 <= value < 2**64
    assert value == hash_block_tokens(None, (1, 2, 3, 4), None)
    assert value == hash_block_tokens(None, (1, 2, 3, 4), ())


def test_hash_is_the_same_in_another_process():
    code = (
        "from ladle.core.block_hash import hash_block_tokens as h;"
        "print(h(h(None, (1, 2, 3, 4), ('salt',)), (5, 6, 7, 8), ('salt',)))"
    )
    here = hash_block_tokens(
        hash_block_tokens(None, (1, 2, 3, 4), ("salt",)), (5, 6, 7, 8), ("salt",)
    )
    for hash_seed in ("1", "2"):  # a different str-hash salt must not matter
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": hash_seed},
        )
        assert int(result.stdout) == here


def test_hash_depends_on_every_input():
    base = hash_block_tokens(None, (1, 2, 3, 4))
    assert hash_block_tokens(None, (1, 2, 3, 5)) != base
    assert hash_block_tokens(None, (4, 3, 2, 1)) != base
    assert hash_block_tokens(0, (1, 2, 3, 4)) != base  # parent 0 is not "no parent"
    assert hash_block_tokens(base, (1, 2, 3, 4)) != base
    assert hash_block_tokens(None, (1, 2, 3, 4), ("a",)) != base
    assert hash_block_tokens(None, (1, 2, 3, 4), ("a",)) != hash_block_tokens(
        None, (1, 2, 3, 4), ("b",)
    )


def test_hash_rejects_unstable_extra_keys():
    with pytest.raises(TypeError):
        hash_block_tokens(None, (1,), (object(),))


def test_extend_block_hashes_full_blocks_only_and_chained():
    request = make_request("a", list(range(10)))
    extend_block_hashes(request, BLOCK_SIZE)
    first = hash_block_tokens(None, (0, 1, 2, 3))
    assert request.block_hashes == [first, hash_block_tokens(first, (4, 5, 6, 7))]
    extend_block_hashes(request, BLOCK_SIZE)  # idempotent
    assert len(request.block_hashes) == 2
    request.append_output_token(10)
    request.append_output_token(11)  # output tokens fill the third block
    extend_block_hashes(request, BLOCK_SIZE)
    assert request.block_hashes[2] == hash_block_tokens(request.block_hashes[1], (8, 9, 10, 11))


def test_extend_block_hashes_folds_in_the_cache_salt():
    plain = make_request("a", list(range(8)))
    salted = make_request("b", list(range(8)), cache_salt="tenant-1")
    extend_block_hashes(plain, BLOCK_SIZE)
    extend_block_hashes(salted, BLOCK_SIZE)
    assert salted.block_hashes[0] == hash_block_tokens(None, (0, 1, 2, 3), ("tenant-1",))
    assert not set(plain.block_hashes) & set(salted.block_hashes)


# ---- hits ----


def test_hit_granularity_and_last_token_recomputed():
    manager = KVCacheManager(num_blocks=20, block_size=BLOCK_SIZE)
    schedule_prefill(manager, make_request("seed", list(range(12))))  # 3 full blocks cached
    assert cached_ids(manager) == [1, 2, 3]

    def hit(prompt: list[int]) -> tuple[list[int], int]:
        blocks, num_tokens = manager.get_computed_blocks(make_request("probe", prompt))
        return [block.block_id for block in blocks], num_tokens

    assert hit(list(range(3))) == ([], 0)  # shorter than a block
    assert hit(list(range(4))) == ([], 0)  # one full block, but its last token is recomputed
    assert hit(list(range(5))) == ([1], 4)
    assert hit(list(range(7))) == ([1], 4)  # partial second block never shared
    assert hit(list(range(8))) == ([1], 4)  # exactly 2 blocks: hits 1
    assert hit(list(range(9))) == ([1, 2], 8)
    assert hit(list(range(12))) == ([1, 2], 8)  # whole prompt cached: last block recomputed
    assert hit(list(range(13))) == ([1, 2, 3], 12)
    assert hit(list(range(8)) + [99, 10, 11, 12, 0]) == ([1, 2], 8)  # diverges in block 3
    assert hit([99] + list(range(1, 13))) == ([], 0)  # diverges in block 1: nothing after hits


def test_same_block_after_a_different_prefix_does_not_hit():
    manager = KVCacheManager(num_blocks=20, block_size=BLOCK_SIZE)
    schedule_prefill(manager, make_request("a", [0, 1, 2, 3, 4, 5, 6, 7, 8]))
    blocks, num_tokens = manager.get_computed_blocks(
        make_request("b", [9, 9, 9, 9, 4, 5, 6, 7, 8])
    )
    assert (blocks, num_tokens) == ([], 0)


def test_cache_salt_separates():
    manager = KVCacheManager(num_blocks=20, block_size=BLOCK_SIZE)
    prompt = list(range(9))
    schedule_prefill(manager, make_request("a", prompt, cache_salt="x"))
    assert manager.get_computed_blocks(make_request("b", prompt))[1] == 0
    assert manager.get_computed_blocks(make_request("c", prompt, cache_salt="y"))[1] == 0
    assert manager.get_computed_blocks(make_request("d", prompt, cache_salt="x"))[1] == 8


def test_only_computed_full_blocks_are_cached():
    manager = KVCacheManager(num_blocks=20, block_size=BLOCK_SIZE)
    request = make_request("a", list(range(10)))
    manager.allocate_slots(request, 6)  # chunked prefill: blocks 1, 2 for 6 tokens
    request.num_computed_tokens = 6
    manager.cache_computed_blocks(request)
    assert cached_ids(manager) == [1]  # block 2 is half written
    manager.allocate_slots(request, 4)
    request.num_computed_tokens = 10
    manager.cache_computed_blocks(request)
    assert cached_ids(manager) == [1, 2]  # block 3 holds 2 tokens: never cached
    manager.cache_computed_blocks(request)  # nothing new: no change
    assert cached_ids(manager) == [1, 2]


def test_decoded_tokens_become_cacheable():
    manager = KVCacheManager(num_blocks=20, block_size=BLOCK_SIZE)
    request = make_request("a", list(range(6)))
    schedule_prefill(manager, request)
    assert cached_ids(manager) == [1]
    decode_step(manager, request, 6)
    assert cached_ids(manager) == [1]
    decode_step(manager, request, 7)  # block 2 now full and computed
    assert cached_ids(manager) == [1, 2]
    follow_up = make_request("b", list(range(8)) + [42])  # a second turn of the conversation
    assert manager.get_computed_blocks(follow_up)[1] == 8


def test_shared_prefix_ref_counts():
    manager = KVCacheManager(num_blocks=20, block_size=BLOCK_SIZE)
    first = make_request("a", list(range(10)))
    second = make_request("b", list(range(8)) + [50, 51, 52])
    assert schedule_prefill(manager, first) == 0
    assert schedule_prefill(manager, second) == 8
    assert manager.get_block_ids("a") == [1, 2, 3]
    assert manager.get_block_ids("b") == [1, 2, 4]
    assert ref_counts(manager, [1, 2, 3, 4]) == [2, 2, 1, 1]
    manager.free(first)
    assert ref_counts(manager, [1, 2, 3, 4]) == [1, 1, 0, 1]
    assert 3 in free_ids(manager) and 1 not in free_ids(manager)
    manager.free(second)
    assert ref_counts(manager, [1, 2, 3, 4]) == [0, 0, 0, 0]


def test_hit_counters():
    manager = KVCacheManager(num_blocks=20, block_size=BLOCK_SIZE)
    schedule_prefill(manager, make_request("a", list(range(10))))
    schedule_prefill(manager, make_request("b", list(range(10))))
    assert manager.prefix_cache_queries == 20
    assert manager.prefix_cache_hits == 8


def test_caching_disabled():
    manager = KVCacheManager(num_blocks=20, block_size=BLOCK_SIZE, enable_caching=False)
    schedule_prefill(manager, make_request("a", list(range(10))))
    assert schedule_prefill(manager, make_request("b", list(range(10)))) == 0
    assert manager.block_pool.cached_block_by_hash == {}
    assert manager.get_block_ids("b") == [4, 5, 6]
    assert manager.prefix_cache_queries == 0


# ---- eviction ----


def test_lru_eviction_order_is_exact():
    manager = KVCacheManager(num_blocks=7, block_size=BLOCK_SIZE)  # usable blocks 1..6
    first = make_request("a", list(range(9)))  # blocks 1, 2 cached, 3 partial
    second = make_request("b", list(range(100, 109)))  # blocks 4, 5 cached, 6 partial
    schedule_prefill(manager, first)
    schedule_prefill(manager, second)
    manager.free(first)
    manager.free(second)
    # Each request's tail first, and the earlier-freed request before the later one.
    assert free_ids(manager) == [3, 2, 1, 6, 5, 4]
    assert cached_ids(manager) == [1, 2, 4, 5]

    # A newcomer that shares nothing takes 3 blocks from the head: 3 (uncached), then 2 and 1,
    # whose hashes are evicted.
    third = make_request("c", list(range(200, 209)))
    schedule_prefill(manager, third)
    assert manager.get_block_ids("c") == [3, 2, 1]
    # Blocks 1, 2 lost "a"'s hashes; 3 and 2 now hold "c"'s two full blocks.
    assert cached_ids(manager) == [2, 3, 4, 5]
    assert manager.block_pool.blocks[1].block_hash is None
    assert free_ids(manager) == [6, 5, 4]
    assert manager.get_computed_blocks(make_request("a2", list(range(9))))[1] == 0

    # A hit on a free cached block takes it off the free list, out of turn.
    fourth = make_request("d", list(range(100, 104)) + [7, 7, 7])  # shares block 4 only
    assert schedule_prefill(manager, fourth) == 4
    assert manager.get_block_ids("d") == [4, 6]
    assert free_ids(manager) == [5]
    assert cached_ids(manager) == [2, 3, 4, 5]


def test_reset_prefix_cache_through_the_manager():
    manager = KVCacheManager(num_blocks=10, block_size=BLOCK_SIZE)
    request = make_request("a", list(range(9)))
    schedule_prefill(manager, request)
    assert manager.reset_prefix_cache() is False
    manager.free(request)
    assert manager.reset_prefix_cache() is True
    assert manager.get_computed_blocks(make_request("b", list(range(9)))) == ([], 0)
    # The pool works normally afterwards, and caches again.
    schedule_prefill(manager, make_request("c", list(range(9))))
    assert manager.get_computed_blocks(make_request("d", list(range(9))))[1] == 8
