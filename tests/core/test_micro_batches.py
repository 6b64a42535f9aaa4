"""The scheduler under pipeline parallelism (two micro-batches): a request whose token is in
flight waits for its step to be read, the running decodes split evenly over the two steps in
flight, and a long prompt's chunks fill both (a chunk that samples nothing needs no read)."""

from __future__ import annotations

from request_factory import granted, one_token_each
from test_scheduler import BLOCK_SIZE, make_request

from ladle.config import CacheConfig, SchedulerConfig
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.scheduler import Scheduler


def make_pipelined_scheduler(budget: int = 64) -> Scheduler:
    manager = KVCacheManager(num_blocks=128, block_size=BLOCK_SIZE, enable_caching=True)
    return Scheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8),
        CacheConfig(block_size=BLOCK_SIZE),
        manager,
        max_model_len=256,
        num_micro_batches=2,
    )


def test_decodes_split_over_two_micro_batches_and_wait_for_their_step():
    scheduler = make_pipelined_scheduler()
    names = ["a", "b", "c", "d", "e"]
    for name in names:
        scheduler.add_request(make_request(name, num_prompt_tokens=4, max_tokens=20))
    prompts = scheduler.schedule()  # every prompt (no decode yet: no cap)
    assert granted(prompts) == {name: 4 for name in names}
    assert not scheduler.schedule().scheduled  # every token is in flight
    scheduler.update_from_output(prompts, one_token_each(prompts, [5] * len(names)))
    first = scheduler.schedule()
    second = scheduler.schedule()
    assert granted(first) == {"a": 1, "b": 1, "c": 1}  # ceil(5 / 2) of the decodes
    assert granted(second) == {"d": 1, "e": 1}  # the rest: disjoint
    assert not scheduler.schedule().scheduled
    scheduler.update_from_output(first, one_token_each(first, [6, 6, 6]))
    third = scheduler.schedule()  # the first micro-batch's requests, read, go again
    assert granted(third) == {"a": 1, "b": 1, "c": 1}
    scheduler.update_from_output(second, one_token_each(second, [6, 6]))
    scheduler.update_from_output(third, one_token_each(third, [7, 7, 7]))
    assert [r.output_token_ids for r in scheduler.running] == [[5, 6, 7]] * 3 + [[5, 6]] * 2


def test_a_long_prompts_chunks_fill_both_micro_batches():
    scheduler = make_pipelined_scheduler(budget=8)
    scheduler.add_request(make_request("long", num_prompt_tokens=20, max_tokens=4))
    chunks = [scheduler.schedule() for _ in range(3)]  # 8 + 8 + 4, none read yet
    assert [granted(chunk) for chunk in chunks] == [{"long": 8}, {"long": 8}, {"long": 4}]
    assert not scheduler.schedule().scheduled  # the last chunk samples: wait for it
    outputs = []
    for chunk in chunks:  # read in order; only the last chunk samples a token
        outputs += scheduler.update_from_output(chunk, one_token_each(chunk, [9]))
    assert [o.new_token_ids for o in outputs if o.new_token_ids] == [[9]]
    assert granted(scheduler.schedule()) == {"long": 1}
