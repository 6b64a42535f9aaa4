"""The host tier of the KV cache without a model: write-back of freed blocks as they near
eviction (a look-ahead over the free queue, or at eviction), LRU order across both tiers, loads
after device eviction, salts, pins and faults (core/host_tier.py, core/kv_transfers.py, the
KV-manager and scheduler parts)."""

from __future__ import annotations

import pytest
from request_factory import make_request, one_token_each, schedule_prefill

from ladle.config import CacheConfig, SchedulerConfig
from ladle.core.block_hash import extend_block_hashes
from ladle.core.host_tier import HostTier
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.preemption_cost import PreemptionPolicy
from ladle.core.request import RequestStatus
from ladle.core.scheduler import Scheduler
from ladle.protocol.step import KV_LOAD, KV_STORE

BLOCK_SIZE = 4


def settle(manager: KVCacheManager, failed: bool = False) -> list:
    """Issue every queued copy and report it done (or failed), as a worker's step would."""
    operations = manager.take_kv_operations()
    ids = [op.op_id for op in operations]
    if failed:
        manager.finish_transfers([], {op_id: "copy failed" for op_id in ids})
    else:
        manager.finish_transfers(ids, {})
    return operations


def prompt(first: int, num_blocks: int) -> list[int]:
    """num_blocks full blocks of distinct tokens plus one more token (so all of them may hit)."""
    return list(range(first, first + num_blocks * BLOCK_SIZE + 1))


def host_ids_of(manager: KVCacheManager, hashes: list[int]) -> list[int]:
    tier = manager.host_tier
    return [tier.lookup(h).block_id for h in hashes]


def test_host_tier_off_without_blocks_or_caching():
    assert KVCacheManager(8, BLOCK_SIZE).host_tier is None
    assert KVCacheManager(8, BLOCK_SIZE, enable_caching=False, num_host_blocks=4).host_tier is None
    with pytest.raises(ValueError, match="num_host_blocks"):
        KVCacheManager(8, BLOCK_SIZE, num_host_blocks=-1)


def test_freed_blocks_are_written_back_in_one_batched_store():
    manager = KVCacheManager(16, BLOCK_SIZE, num_host_blocks=8)
    request = make_request("a", prompt(0, 3))
    schedule_prefill(manager, request)
    device_ids = manager.get_block_ids("a")[:3]
    # Blocks a request holds are not written back: they cannot be evicted.
    assert manager.take_kv_operations() == []
    assert [manager.block_pool.blocks[i].ref_count for i in device_ids] == [1, 1, 1]
    manager.free(request)
    # The window (the whole pool here) sees them now: one store, no reference taken.
    (store,) = manager.take_kv_operations()
    assert store.kind == KV_STORE and not store.before_forward
    assert store.source_block_ids == device_ids[::-1]  # freed tail first, as evicted
    assert store.target_block_ids == [0, 1, 2]
    assert manager.block_pool.num_free_blocks == manager.block_pool.num_usable_blocks
    # Not a hit until the copy is done.
    assert all(manager.host_tier.lookup(h) is None for h in request.block_hashes)
    manager.finish_transfers([store.op_id], {})
    assert host_ids_of(manager, request.block_hashes) == [2, 1, 0]
    # A block the host already holds is not stored again.
    again = make_request("b", prompt(0, 3))
    schedule_prefill(manager, again)
    manager.free(again)
    assert manager.take_kv_operations() == []


def free_and_settle(manager: KVCacheManager, request) -> list:
    manager.free(request)
    return settle(manager)


def test_exact_lru_order_across_tiers():
    manager = KVCacheManager(32, BLOCK_SIZE, num_host_blocks=4)
    a, b = make_request("a", prompt(0, 2)), make_request("b", prompt(100, 2))
    for request in (a, b):
        schedule_prefill(manager, request)
        free_and_settle(manager, request)
    tier = manager.host_tier
    # Stored as freed: tail first.
    assert tier.lru_hashes() == [*a.block_hashes[::-1], *b.block_hashes[::-1]]
    # A device hit on a's prefix uses those hashes: they become the host's most recent.
    reuse = make_request("a2", prompt(0, 2))
    assert schedule_prefill(manager, reuse) == 2 * BLOCK_SIZE
    assert tier.lru_hashes() == [*b.block_hashes[::-1], *a.block_hashes]
    # The host is full: two new blocks evict b's two, least recently used first.
    c = make_request("c", prompt(200, 2))
    schedule_prefill(manager, c)
    (store,) = free_and_settle(manager, c)
    assert sorted(store.target_block_ids) == [2, 3]  # b's host blocks
    assert tier.lru_hashes() == [*a.block_hashes, *c.block_hashes[::-1]]
    assert all(not tier.contains(h) for h in b.block_hashes)


def test_prefix_evicted_from_the_device_is_loaded_back_from_the_host():
    # 4 usable device blocks: a second 3-block prompt evicts the first one's blocks.
    manager = KVCacheManager(5, BLOCK_SIZE, num_host_blocks=8)
    first = make_request("first", prompt(0, 2))
    schedule_prefill(manager, first)
    free_and_settle(manager, first)
    filler = make_request("filler", prompt(500, 3))
    schedule_prefill(manager, filler)
    free_and_settle(manager, filler)
    again = make_request("again", prompt(0, 2))
    device_hits, num_hit = manager.get_computed_blocks(again)
    assert (device_hits, num_hit) == ([], 0)  # evicted from the device
    host_hits = manager.find_host_hits(again, 0)
    assert [block.block_hash for block in host_hits] == first.block_hashes
    assert manager.start_load(again, device_hits, host_hits)
    assert manager.host_cache_hits == 2 * BLOCK_SIZE
    assert all(block.ref_count == 1 for block in host_hits)  # pinned while loading
    (load,) = manager.take_kv_operations()
    assert load.kind == KV_LOAD
    assert load.source_block_ids == [block.block_id for block in host_hits]
    assert load.target_block_ids == manager.get_block_ids("again")
    finished = manager.finish_transfers([load.op_id], {})
    assert finished.loaded == {"again": 2}
    assert all(block.ref_count == 0 for block in host_hits)
    # The loaded blocks are device hits now, in the blocks the load wrote.
    assert manager.num_blocks_of("again") == 0
    device_hits, num_hit = manager.get_computed_blocks(again)
    assert num_hit == 2 * BLOCK_SIZE
    assert [block.block_id for block in device_hits] == load.target_block_ids


def test_salted_blocks_never_hit_another_salt_on_the_host():
    manager = KVCacheManager(5, BLOCK_SIZE, num_host_blocks=8)
    salted = make_request("salted", prompt(0, 2), cache_salt="tenant-a")
    schedule_prefill(manager, salted)
    free_and_settle(manager, salted)
    filler = make_request("filler", prompt(500, 3))
    schedule_prefill(manager, filler)
    free_and_settle(manager, filler)
    for salt, expected in ((None, 0), ("tenant-b", 0), ("tenant-a", 2)):
        probe = make_request(f"probe-{salt}", prompt(0, 2), cache_salt=salt)
        device_hits, _ = manager.get_computed_blocks(probe)
        assert len(manager.find_host_hits(probe, len(device_hits))) == expected


def test_full_host_tier_drops_write_backs_without_error():
    manager = KVCacheManager(32, BLOCK_SIZE, num_host_blocks=2)
    a = make_request("a", prompt(0, 2))
    schedule_prefill(manager, a)
    manager.free(a)
    (store,) = manager.take_kv_operations()
    # Both host blocks are being written (not evictable): b's stores are dropped.
    b = make_request("b", prompt(100, 2))
    schedule_prefill(manager, b)
    manager.free(b)
    assert manager.take_kv_operations() == []
    assert manager.transfers.counts.num_stores_dropped == 2
    manager.finish_transfers([store.op_id], {})
    assert sorted(manager.host_tier.lru_hashes()) == sorted(a.block_hashes)
    assert manager.block_pool.num_free_blocks == manager.block_pool.num_usable_blocks


def test_failed_store_frees_both_sides():
    manager = KVCacheManager(16, BLOCK_SIZE, num_host_blocks=4)
    request = make_request("a", prompt(0, 2))
    schedule_prefill(manager, request)
    manager.free(request)
    settle(manager, failed=True)
    assert manager.block_pool.num_free_blocks == manager.block_pool.num_usable_blocks
    assert manager.host_tier.num_used_blocks == 0
    assert manager.transfers.counts.num_failed_ops == 1


def test_failed_load_frees_both_sides_and_forgets_the_host_copy():
    manager = KVCacheManager(5, BLOCK_SIZE, num_host_blocks=8)
    first = make_request("first", prompt(0, 2))
    schedule_prefill(manager, first)
    free_and_settle(manager, first)
    filler = make_request("filler", prompt(500, 3))
    schedule_prefill(manager, filler)
    free_and_settle(manager, filler)
    again = make_request("again", prompt(0, 2))
    device_hits, _ = manager.get_computed_blocks(again)
    assert manager.start_load(again, device_hits, manager.find_host_hits(again, 0))
    finished = manager.finish_transfers(
        [], {op.op_id: "copy failed" for op in manager.take_kv_operations()}
    )
    assert finished.failed == ["again"]
    assert manager.num_blocks_of("again") == 0
    assert manager.block_pool.num_free_blocks == manager.block_pool.num_usable_blocks
    assert manager.find_host_hits(again, 0) == []
    assert manager.host_tier.usage == 0.0


# ---- the scheduler ----


def make_scheduler(num_blocks: int, num_host_blocks: int, mode: str = "auto") -> Scheduler:
    manager = KVCacheManager(num_blocks, BLOCK_SIZE, num_host_blocks=num_host_blocks)
    return Scheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8),
        CacheConfig(block_size=BLOCK_SIZE),
        manager,
        max_model_len=256,
        preemption=PreemptionPolicy(mode=mode, block_size=BLOCK_SIZE),
    )


def run_to_completion(scheduler: Scheduler, max_steps: int = 200) -> list:
    """Step until every request ended and every copy settled (the engine's idle flush)."""
    plans = []
    for _ in range(max_steps):
        if not (scheduler.has_unfinished_requests() or scheduler.has_kv_transfers):
            return plans
        plan = scheduler.schedule()
        result = one_token_each(plan, [7] * len(plan.scheduled))
        result.kv_operations_done = [op.op_id for op in plan.kv_operations]
        scheduler.update_from_output(plan, result)
        plans.append(plan)
    raise AssertionError("requests did not finish")


def flush_write_backs(scheduler: Scheduler) -> list:
    """One plan with nothing to run: it writes back the blocks freed since the last one."""
    plan = scheduler.schedule()
    result = one_token_each(plan, [])
    result.kv_operations_done = [op.op_id for op in plan.kv_operations]
    scheduler.update_from_output(plan, result)
    return plan.kv_operations


def evicted_prefix_scheduler() -> Scheduler:
    """A scheduler whose host tier holds prompt(0, 3) after the device evicted it."""
    scheduler = make_scheduler(num_blocks=9, num_host_blocks=16)
    scheduler.add_request(make_request("first", prompt(0, 3), max_tokens=1))
    run_to_completion(scheduler)
    scheduler.add_request(make_request("filler", prompt(500, 7), max_tokens=1))
    plans = run_to_completion(scheduler)
    # The filler evicted first's blocks, freed when no plan followed: stored at eviction,
    # before the forward that rewrote them.
    (store,) = plans[0].kv_operations
    assert store.kind == KV_STORE and store.before_forward and len(store.source_block_ids) == 3
    flush_write_backs(scheduler)  # the filler's blocks, so later plans carry only loads
    return scheduler


def test_a_request_waits_for_its_kv_without_holding_the_batch():
    scheduler = evicted_prefix_scheduler()
    scheduler.add_request(make_request("again", prompt(0, 3), max_tokens=2))
    scheduler.add_request(make_request("other", prompt(900, 1), max_tokens=2))
    plan = scheduler.schedule()
    assert plan.request_ids() == ["other"]  # "again" waits for its KV beside it
    assert scheduler.requests["again"].status == RequestStatus.WAITING_FOR_KV
    (load,) = plan.kv_operations
    assert load.kind == KV_LOAD and len(load.target_block_ids) == 3
    result = one_token_each(plan, [7])
    result.kv_operations_done = [load.op_id]
    scheduler.update_from_output(plan, result)
    assert scheduler.requests["again"].status == RequestStatus.WAITING
    plan = scheduler.schedule()
    # Only the last token is computed: the three loaded blocks are device hits.
    granted = {s.request_id: (s.num_computed_before, s.num_tokens) for s in plan.scheduled}
    assert granted["again"] == (3 * BLOCK_SIZE, 1)
    new_blocks = next(s.new_blocks for s in plan.scheduled if s.request_id == "again")
    assert new_blocks.block_ids[:3] == load.target_block_ids


@pytest.mark.parametrize("overlapped_abort", [False, True])
def test_abort_while_waiting_for_kv_frees_everything(overlapped_abort):
    scheduler = evicted_prefix_scheduler()
    manager = scheduler.kv_cache_manager
    scheduler.add_request(make_request("again", prompt(0, 3), max_tokens=2))
    plan = scheduler.schedule()
    assert scheduler.requests["again"].status == RequestStatus.WAITING_FOR_KV
    scheduler.finish_requests(["again"], RequestStatus.FINISHED_ABORTED)
    if overlapped_abort:
        # The copy's report arrives after the abort: it is ignored.
        result = one_token_each(plan, [])
        result.kv_operations_done = [op.op_id for op in plan.kv_operations]
        scheduler.update_from_output(plan, result)
    assert not scheduler.has_unfinished_requests()
    assert manager.usage == 0.0 and manager.host_usage == 0.0
    assert manager.transfers.num_in_flight == 0


def test_soak_leaves_no_block_in_use_in_either_tier():
    scheduler = make_scheduler(num_blocks=12, num_host_blocks=10)
    for index in range(24):
        first = (index % 5) * 1000  # five conversations' prefixes, coming back
        scheduler.add_request(
            make_request(f"r{index}", prompt(first, 2 + index % 3), max_tokens=3 + index % 4)
        )
        if index % 7 == 3:
            scheduler.finish_requests([f"r{index - 1}"], RequestStatus.FINISHED_ABORTED)
    plans = run_to_completion(scheduler)
    manager = scheduler.kv_cache_manager
    assert any(op.kind == KV_LOAD for plan in plans for op in plan.kv_operations)
    assert manager.usage == 0.0 and manager.host_usage == 0.0
    assert manager.transfers.num_in_flight == 0
    assert scheduler.kv_cache_manager.reset_prefix_cache()


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_forced_preemption_modes(mode):
    # 6 usable blocks: two requests growing past two blocks each make the newer one a victim.
    scheduler = make_scheduler(num_blocks=7, num_host_blocks=16, mode=mode)
    scheduler.add_request(make_request("old", prompt(0, 2), max_tokens=10))
    scheduler.add_request(make_request("new", prompt(100, 2), max_tokens=10))
    run_to_completion(scheduler)
    assert scheduler.num_preemptions >= 1
    assert scheduler.num_swapped_preemptions == (scheduler.num_preemptions if mode == "swap" else 0)


def test_host_tier_rejects_bad_sizes_and_unbalanced_pins():
    with pytest.raises(ValueError, match="num_blocks"):
        HostTier(0)
    tier = HostTier(2)
    block = tier.allocate_for_store(1)
    with pytest.raises(ValueError, match="unpinned"):
        tier.unpin([block])
    request = make_request("x", prompt(0, 1))
    extend_block_hashes(request, BLOCK_SIZE)
    assert tier.allocate_for_store(1) is None  # already there


def test_pinned_count_follows_every_transition():
    tier = HostTier(4)

    def pinned_by_scan() -> int:
        entries = [tier._by_hash[h] for h in tier.lru_hashes()]
        return sum(1 for entry in entries if entry.ref_count or not entry.is_ready)

    a, b, c = (tier.allocate_for_store(h) for h in (10, 11, 12))
    assert tier.num_pinned_blocks == pinned_by_scan() == 3
    tier.store_done(a)
    tier.store_done(b)
    tier.store_done(b)  # reported twice: counted once
    assert tier.num_pinned_blocks == pinned_by_scan() == 1
    tier.pin([a, a, b])
    assert tier.num_pinned_blocks == pinned_by_scan() == 3
    tier.unpin([a])
    assert tier.num_pinned_blocks == pinned_by_scan() == 3
    tier.unpin([a, b])
    tier.drop(c)  # its store failed
    assert tier.num_pinned_blocks == pinned_by_scan() == 0
    assert tier.usage == 0.0 and tier.num_used_blocks == 2
    assert tier.reset() and tier.num_used_blocks == 0


def test_loading_requests_hold_seats_so_no_load_outruns_the_batch():
    # Two prefixes on the host only; one seat: the second loads only once the first has run,
    # so its blocks are not loaded early and evicted before it could use them.
    manager = KVCacheManager(9, BLOCK_SIZE, num_host_blocks=16)
    scheduler = Scheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=1),
        CacheConfig(block_size=BLOCK_SIZE), manager, max_model_len=256,
    )
    for name, first in (("a", 0), ("b", 100)):
        scheduler.add_request(make_request(name, prompt(first, 2), max_tokens=1))
    scheduler.add_request(make_request("filler", prompt(500, 7), max_tokens=1))
    run_to_completion(scheduler)
    flush_write_backs(scheduler)
    for name, first in (("a2", 0), ("b2", 100)):
        scheduler.add_request(make_request(name, prompt(first, 2), max_tokens=1))
    plan = scheduler.schedule()
    assert [op.kind for op in plan.kv_operations] == [KV_LOAD]
    assert list(scheduler.waiting_for_kv) == ["a2"]
    result = one_token_each(plan, [])
    result.kv_operations_done = [op.op_id for op in plan.kv_operations]
    scheduler.update_from_output(plan, result)
    plans = run_to_completion(scheduler)
    assert [op.kind for p in plans for op in p.kv_operations] == [KV_LOAD]  # b2's, later
    hits = {s.request_id: s.num_computed_before for p in plans for s in p.scheduled}
    assert hits == {"a2": 2 * BLOCK_SIZE, "b2": 2 * BLOCK_SIZE}  # both ran on loaded prefixes
