"""Decode-first under an ITL SLO: the fitted step-time model, the allowance it gives, and the
scheduler honouring it (prompt chunks shrink beside decodes; decodes are never cut)."""

from __future__ import annotations

import pytest
from request_factory import granted, one_token_each

from ladle.config import CacheConfig, SchedulerConfig
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.prefill_budget import SAFETY, ItlPrefillBudget
from ladle.core.request import Request
from ladle.core.scheduler import Scheduler
from ladle.sampling.params import SamplingParams


def _linear_steps(policy: ItlPrefillBudget, intercept: float, slope: float) -> None:
    for tokens in (1, 8, 64, 256, 512, 1024):
        policy.observe(tokens, intercept + slope * tokens)


def test_the_fit_recovers_a_linear_step_time():
    policy = ItlPrefillBudget(itl_slo_s=0.05, max_num_batched_tokens=8192)
    _linear_steps(policy, intercept=0.010, slope=0.0001)
    intercept, slope = policy.fit()
    assert intercept == pytest.approx(0.010)
    assert slope == pytest.approx(0.0001)


def test_budget_keeps_the_predicted_step_within_the_slo():
    policy = ItlPrefillBudget(itl_slo_s=0.05, max_num_batched_tokens=8192)
    _linear_steps(policy, intercept=0.010, slope=0.0001)
    # 0.05 * 0.9 = 0.045 s leaves (0.045 - 0.010) / 0.0001 = 350 tokens, less the 10 decodes.
    assert SAFETY == 0.9
    assert policy.budget(num_decodes=10) == 340
    # No decode running: no gap to protect, the whole budget.
    assert policy.budget(num_decodes=0) == 8192


def test_budget_floor_and_cold_start():
    policy = ItlPrefillBudget(itl_slo_s=0.005, max_num_batched_tokens=8192, min_prefill_tokens=16)
    assert policy.budget(num_decodes=4) == 8192  # nothing measured yet: no limit
    _linear_steps(policy, intercept=0.010, slope=0.0001)  # even an empty step breaks the SLO
    assert policy.budget(num_decodes=4) == 16  # prompts still move
    with pytest.raises(ValueError, match="itl_slo"):
        ItlPrefillBudget(itl_slo_s=0, max_num_batched_tokens=8)


def test_scheduler_shrinks_prompt_chunks_beside_decodes_but_not_decodes():
    config = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8, itl_slo_ms=50.0)
    manager = KVCacheManager(num_blocks=256, block_size=4, enable_caching=False)
    scheduler = Scheduler(config, CacheConfig(block_size=4), manager, max_model_len=1024)
    _linear_steps(scheduler.prefill_budget, intercept=0.010, slope=0.0002)

    def request(request_id: str, length: int) -> Request:
        return Request(request_id, list(range(1, length + 1)), SamplingParams(max_tokens=50))

    first = request("decoder", 8)
    scheduler.add_request(first)
    output = scheduler.schedule()  # nothing decodes yet: the full prompt
    assert granted(output) == {"decoder": 8}
    scheduler.update_from_output(output, one_token_each(output, [5]))

    scheduler.add_request(request("long", 400))
    output = scheduler.schedule()
    # (0.045 - 0.010) / 0.0002 = 175 tokens per step, less the one decode: a 174-token chunk.
    assert granted(output) == {"decoder": 1, "long": 174}
    scheduler.update_from_output(output, one_token_each(output, [5, 0]))
    output = scheduler.schedule()
    assert granted(output) == {"decoder": 1, "long": 174}


def test_without_an_itl_slo_the_scheduler_gives_the_whole_budget():
    config = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=8)
    manager = KVCacheManager(num_blocks=256, block_size=4, enable_caching=False)
    scheduler = Scheduler(config, CacheConfig(block_size=4), manager, max_model_len=1024)
    assert scheduler.prefill_budget is None
    scheduler.add_request(Request("a", list(range(1, 9)), SamplingParams(max_tokens=50)))
    scheduler.update_from_output(scheduler.schedule(), one_token_each(scheduler.schedule(), [5]))
    scheduler.add_request(Request("b", list(range(1, 401)), SamplingParams(max_tokens=50)))
    assert granted(scheduler.schedule()) == {"a": 1, "b": 400}
    with pytest.raises(ValueError, match="itl_slo_ms"):
        SchedulerConfig(itl_slo_ms=0)
