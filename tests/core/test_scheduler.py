"""The scheduler without a model: token budget, chunked prefill, FCFS with priority, preemption
order, prefix reuse on resume, stop conditions, aborts. Steps are simulated by feeding fake
sampled tokens back through update_from_output."""

from __future__ import annotations

from request_factory import granted, one_token_each

from ladle.config import CacheConfig, SchedulerConfig
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.request import Request, RequestStatus
from ladle.core.scheduler import Scheduler
from ladle.sampling.params import SamplingParams

BLOCK_SIZE = 4
EOS = 99


def make_scheduler(
    num_blocks: int = 64, budget: int = 16, max_num_seqs: int = 8, max_model_len: int = 256
) -> Scheduler:
    manager = KVCacheManager(num_blocks=num_blocks, block_size=BLOCK_SIZE, enable_caching=True)
    return Scheduler(
        SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs),
        CacheConfig(block_size=BLOCK_SIZE),
        manager,
        max_model_len=max_model_len,
    )


def make_request(
    request_id: str, num_prompt_tokens: int, max_tokens: int = 8, priority: int = 0,
    arrival: float = 0.0, first_token: int = 1, **params,
) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=list(range(first_token, first_token + num_prompt_tokens)),
        sampling_params=SamplingParams(max_tokens=max_tokens, **params),
        eos_token_ids=(EOS,),
        priority=priority,
        arrival_time=arrival,
    )


def run_step(scheduler: Scheduler, token_id: int = 7):
    """One step: schedule, then feed back the same token for every request that samples."""
    output = scheduler.schedule()
    sampled = [token_id] * len(output.scheduled)
    results = scheduler.update_from_output(output, one_token_each(output, sampled))
    return output, granted(output), results


def test_budget_goes_to_running_first_then_chunks_waiting():
    scheduler = make_scheduler(budget=16)
    for index in range(3):
        scheduler.add_request(make_request(f"r{index}", 10, arrival=index, first_token=100 * index))
    _, granted, results = run_step(scheduler)
    assert granted == {"r0": 10, "r1": 6}  # r1's prompt is chunked; r2 must wait
    assert [r.request_id for r in results] == ["r0"]  # only a finished prompt samples
    _, granted, results = run_step(scheduler)
    # r0 decodes one token, r1 finishes its prompt, r2 gets the rest of the budget.
    assert granted == {"r0": 1, "r1": 4, "r2": 10}
    assert [r.request_id for r in results] == ["r0", "r1", "r2"]


def test_max_num_seqs_caps_the_running_set():
    scheduler = make_scheduler(budget=64, max_num_seqs=2)
    for index in range(3):
        scheduler.add_request(make_request(f"r{index}", 4, arrival=index, first_token=10 * index))
    _, granted, _ = run_step(scheduler)
    assert set(granted) == {"r0", "r1"}
    assert scheduler.get_stats().num_waiting_reqs == 1


def test_priority_orders_the_waiting_queue():
    scheduler = make_scheduler(budget=4)
    scheduler.add_request(make_request("late-urgent", 4, priority=-1, arrival=5.0, first_token=50))
    scheduler.add_request(make_request("early", 4, priority=0, arrival=1.0, first_token=10))
    scheduler.add_request(make_request("early-urgent", 4, priority=-1, arrival=2.0, first_token=30))
    first_scheduled = []
    for _ in range(6):
        output, _, _ = run_step(scheduler)
        first_scheduled.extend(
            r.request_id for r in output.scheduled if r.request_id not in first_scheduled
        )
    assert first_scheduled == ["early-urgent", "late-urgent", "early"]


def test_preemption_takes_lowest_priority_before_newest():
    # 6 usable blocks of 4 tokens. Three 8-token prompts take 2 blocks each; the first decode
    # step needs a third block for each, so someone must go.
    scheduler = make_scheduler(num_blocks=7, budget=64)
    scheduler.add_request(make_request("old", 8, arrival=1.0, first_token=10))
    scheduler.add_request(make_request("new", 8, arrival=3.0, first_token=30))
    scheduler.add_request(make_request("low", 8, priority=1, arrival=2.0, first_token=50))
    run_step(scheduler)
    assert scheduler.kv_cache_manager.num_free_blocks == 0
    output, granted, _ = run_step(scheduler)
    # 'low' has the lowest priority though it is not the newest; its two blocks are enough.
    assert output.preempted_request_ids == ["low"]
    assert granted == {"old": 1, "new": 1}
    low = scheduler.requests["low"]
    assert low.status == RequestStatus.PREEMPTED and low.num_computed_tokens == 0


def test_preempted_request_resumes_from_its_cached_blocks():
    # 5 usable blocks: two 8-token prompts take 4; the decode step after needs 2 more.
    scheduler = make_scheduler(num_blocks=6, budget=64)
    scheduler.add_request(make_request("old", 8, arrival=1.0, first_token=10, max_tokens=4))
    scheduler.add_request(make_request("new", 8, arrival=2.0, first_token=30))
    run_step(scheduler)
    output, granted, _ = run_step(scheduler)
    assert output.preempted_request_ids == ["new"]  # same priority: the newest goes
    assert granted == {"old": 1}
    while "old" in scheduler.requests:
        run_step(scheduler)
    output, granted, _ = run_step(scheduler)
    # 'new' has 9 tokens (8 prompt + 1 sampled). Its two full prompt blocks were freed with
    # their hashes and nobody reused them, so only the 9th token is computed again.
    assert granted == {"new": 1}
    assert scheduler.requests["new"].num_output_tokens == 2


def test_stop_conditions():
    scheduler = make_scheduler(budget=64)
    scheduler.add_request(make_request("eos", 4, first_token=10))
    scheduler.add_request(make_request("ignore", 4, first_token=20, ignore_eos=True, max_tokens=3))
    scheduler.add_request(make_request("min", 4, first_token=30, min_tokens=2))
    scheduler.add_request(make_request("stop-id", 4, first_token=40, stop_token_ids=[EOS]))
    _, _, results = run_step(scheduler, token_id=EOS)
    reasons = {r.request_id: r.finish_reason for r in results}
    assert reasons == {"eos": "stop", "ignore": None, "min": None, "stop-id": "stop"}
    _, _, results = run_step(scheduler, token_id=EOS)
    reasons = {r.request_id: r.finish_reason for r in results}
    assert reasons == {"ignore": None, "min": "stop"}
    _, _, results = run_step(scheduler, token_id=EOS)
    assert {r.request_id: r.finish_reason for r in results} == {"ignore": "length"}
    stats = scheduler.get_stats()
    assert stats.num_running_reqs == 0 and stats.num_free_blocks == stats.num_total_blocks


def test_model_length_caps_generation():
    scheduler = make_scheduler(budget=64, max_model_len=6)
    scheduler.add_request(make_request("r", 4, max_tokens=100))
    outputs = []
    while scheduler.has_unfinished_requests():
        outputs.extend(run_step(scheduler)[2])
    assert [o.finish_reason for o in outputs] == [None, "length"]


def test_abort_frees_blocks_wherever_the_request_is():
    scheduler = make_scheduler(budget=8)
    scheduler.add_request(make_request("running", 8, first_token=10))
    scheduler.add_request(make_request("waiting", 8, first_token=30))
    run_step(scheduler)
    assert scheduler.requests["waiting"].status == RequestStatus.WAITING
    finished = scheduler.finish_requests(["running", "waiting", "unknown"],
                                         RequestStatus.FINISHED_ABORTED)
    assert {r.request_id for r in finished} == {"running", "waiting"}
    assert not scheduler.has_unfinished_requests()
    stats = scheduler.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert scheduler.schedule().scheduled == []


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room():
    manager = KVCacheManager(num_blocks=64, block_size=BLOCK_SIZE, enable_caching=True)
    scheduler = Scheduler(
        SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=8, enable_chunked_prefill=False),
        CacheConfig(block_size=BLOCK_SIZE),
        manager,
        max_model_len=256,
    )
    scheduler.add_request(make_request("a", 10, first_token=10))
    scheduler.add_request(make_request("b", 10, first_token=30))
    _, granted, _ = run_step(scheduler)
    assert granted == {"a": 10}  # b would need chunking: it waits whole
    _, granted, _ = run_step(scheduler)
    assert granted == {"a": 1, "b": 10}
