"""When the KV host tier writes blocks back (core/kv_transfers.py): only cached free blocks
within a window of the free queue's head, found by a cursor that costs nothing while no block
joins the window (core/free_block_queue.py), and at eviction, before the forward, as a last
resort. Nothing is copied while the device evicts nothing (S1: the tier's promised cost)."""

from __future__ import annotations

import random

from request_factory import make_request, one_token_each, schedule_prefill

from ladle.config import CacheConfig, SchedulerConfig
from ladle.core.free_block_queue import FreeBlockQueue, KVBlock
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.kv_transfers import write_back_window
from ladle.core.scheduler import Scheduler
from ladle.protocol.step import KV_STORE

BLOCK_SIZE = 4


def prompt(first: int, num_blocks: int) -> list[int]:
    return list(range(first, first + num_blocks * BLOCK_SIZE + 1))


def test_look_ahead_returns_each_block_once_as_it_joins_the_window():
    rng = random.Random(0)
    blocks = [KVBlock(block_id) for block_id in range(40)]
    queue = FreeBlockQueue(blocks[:30])
    outside = blocks[30:]
    seen_in_window: set[int] = set()
    for _ in range(600):
        action = rng.random()
        if action < 0.3 and queue.num_free_blocks:
            outside.append(queue.popleft())
        elif action < 0.5 and queue.num_free_blocks:
            block = rng.choice(queue.get_all_free_blocks())  # a prefix hit revives it
            queue.remove(block)
            outside.append(block)
        elif outside:
            queue.append(outside.pop(rng.randrange(len(outside))))
        window = rng.randint(0, 12)
        head = queue.get_all_free_blocks()
        joined = queue.look_ahead(window)
        # The reference: the first `window` blocks, less those already returned since they
        # last joined the queue; a block that left the queue is forgotten.
        in_queue = {block.block_id for block in head}
        seen_in_window &= in_queue
        expected = [b for b in head[:window] if b.block_id not in seen_in_window]
        if queue.num_looked_ahead > window:  # a smaller window than before: nothing new
            expected = []
        assert [b.block_id for b in joined] == [b.block_id for b in expected]
        seen_in_window |= {block.block_id for block in joined}
        looked = [block.block_id for block in head if block.looked_ahead]
        assert looked == [block.block_id for block in head[: len(looked)]]
        assert len(looked) == queue.num_looked_ahead


def test_nothing_is_copied_while_the_device_evicts_nothing():
    # S1's shape in miniature: a pool far larger than all the requests' blocks together, every
    # prompt distinct, a host tier, and many steps: no plan carries a copy.
    manager = KVCacheManager(
        2000, BLOCK_SIZE, num_host_blocks=64, write_back_window=write_back_window(64, 8, 4)
    )
    scheduler = Scheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8),
        CacheConfig(block_size=BLOCK_SIZE),
        manager,
        max_model_len=512,
    )
    for index in range(32):
        scheduler.add_request(
            make_request(f"r{index}", prompt(1000 * index, 3 + index % 5), max_tokens=20)
        )

    num_steps = 0
    while scheduler.has_unfinished_requests():
        plan = scheduler.schedule()
        assert plan.kv_operations == []
        scheduler.update_from_output(plan, one_token_each(plan, [7] * len(plan.scheduled)))
        num_steps += 1
    assert num_steps > 50
    assert manager.transfers.counts.num_blocks_stored == 0
    assert manager.host_tier.num_used_blocks == 0


def test_only_cached_blocks_within_the_window_are_written_back():
    manager = KVCacheManager(16, BLOCK_SIZE, num_host_blocks=16, write_back_window=2)
    a = make_request("a", prompt(0, 3))
    schedule_prefill(manager, a)  # blocks 1-4
    manager.free(a)
    # The head holds never-used blocks: nothing cached within the window.
    assert manager.take_kv_operations() == []
    filler = make_request("filler", prompt(500, 10))
    schedule_prefill(manager, filler)  # blocks 5-15: a's cached blocks are now the head
    (store,) = manager.take_kv_operations()
    assert store.kind == KV_STORE and not store.before_forward
    # Freed tail first: block 4 (uncached, the partial one), then 3, 2, 1; the window of two
    # covers blocks 4 and 3, of which 3 is cached.
    assert store.source_block_ids == [3]
    manager.finish_transfers([store.op_id], {})
    assert manager.take_kv_operations() == []  # nothing new joined the window


def test_a_block_evicted_before_the_window_saw_it_is_stored_before_the_forward():
    manager = KVCacheManager(5, BLOCK_SIZE, num_host_blocks=8, write_back_window=0)
    first = make_request("first", prompt(0, 2))
    schedule_prefill(manager, first)
    first_full_blocks = manager.get_block_ids("first")[:2]
    manager.free(first)
    assert manager.take_kv_operations() == []  # a window of 0 looks at nothing
    filler = make_request("filler", prompt(500, 3))
    schedule_prefill(manager, filler)  # hands out first's blocks
    (store,) = manager.take_kv_operations()
    assert store.before_forward  # this step rewrites them: its forward waits for the copy
    assert sorted(store.source_block_ids) == first_full_blocks
    assert manager.transfers.counts.num_blocks_stored_at_eviction == 2
    manager.finish_transfers([store.op_id], {})
    probe = make_request("probe", prompt(0, 2))
    assert manager.get_computed_blocks(probe) == ([], 0)  # evicted from the device
    assert len(manager.find_host_hits(probe, 0)) == 2


def test_the_window_covers_one_step_of_allocations():
    # 8192 tokens in 16-token blocks, plus a partial and a lookahead block per sequence.
    assert write_back_window(8192, 256, 16) == 512 + 512
    assert write_back_window(10, 1, 4) == 3 + 2


def test_blocks_freed_without_write_back_are_never_stored_until_used_again():
    manager = KVCacheManager(5, BLOCK_SIZE, num_host_blocks=8, write_back_window=0)

    def step(name: str, first: int, num_blocks: int, write_back: bool = True) -> list:
        """A request through one plan: prefilled, its copies taken, then freed."""
        request = make_request(name, prompt(first, num_blocks))
        schedule_prefill(manager, request)
        operations = manager.take_kv_operations()
        manager.finish_transfers([op.op_id for op in operations], {})
        manager.free(request, write_back=write_back)
        return operations

    step("victim", 0, 2, write_back=False)  # a preempted request that recomputes
    assert step("filler", 500, 3) == []  # hands out the victim's blocks: nothing stored
    # The filler's blocks are evicted next, with a copy; a prefix hit makes a skipped block
    # worth one again.
    (store,) = step("again", 900, 2, write_back=False)
    assert len(store.source_block_ids) == 2  # two of the filler's three
    (store,) = step("reuse", 900, 2)  # revives "again"'s skipped blocks (device hits)
    assert len(store.source_block_ids) == 1  # the filler's last block, evicted for "reuse"
    (store,) = step("filler2", 700, 3)
    assert store.before_forward and len(store.source_block_ids) == 2  # "again"'s blocks


def test_a_recomputing_victims_blocks_are_skipped_a_swapping_ones_kept():
    from ladle.core.preemption_cost import PreemptionPolicy

    for mode in ("swap", "recompute"):
        # 6 usable blocks: two requests growing past two blocks each make the newer a victim.
        manager = KVCacheManager(7, BLOCK_SIZE, num_host_blocks=16, write_back_window=0)
        scheduler = Scheduler(
            SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8),
            CacheConfig(block_size=BLOCK_SIZE),
            manager,
            max_model_len=256,
            preemption=PreemptionPolicy(mode=mode, block_size=BLOCK_SIZE),
        )
        scheduler.add_request(make_request("old", prompt(0, 2), max_tokens=10))
        scheduler.add_request(make_request("new", prompt(100, 2), max_tokens=10))
        while scheduler.num_preemptions == 0:
            plan = scheduler.schedule()
            scheduler.update_from_output(plan, one_token_each(plan, [7] * len(plan.scheduled)))
        victim = scheduler.requests["new"]
        freed = [manager.block_pool.get_cached_block(h) for h in victim.block_hashes[:2]]
        assert all(block is not None and block.ref_count == 0 for block in freed)
        assert [block.skip_write_back for block in freed] == [mode == "recompute"] * 2
