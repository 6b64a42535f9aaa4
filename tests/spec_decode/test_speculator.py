"""The Speculator between the scheduler and the proposers: adaptive lengths from the step cost,
the counters, and the overlap kept for requests the rule would not draft for."""

from __future__ import annotations

from ladle.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.request import Request
from ladle.core.scheduler import Scheduler
from ladle.sampling.params import SamplingParams
from ladle.spec_decode.speculator import Speculator


def _request(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, tokens, SamplingParams(max_tokens=50))


def test_drafts_at_batch_1_and_none_when_tokens_cost_their_share():
    speculator = Speculator(SpeculativeConfig(method="ngram", num_speculative_tokens=4))
    request = _request("a", [1, 2, 3, 4, 5, 1, 2, 3])
    # Memory-bound steps: 1 and 5 tokens cost about the same.
    speculator.observe_step(1, 0.010)
    speculator.observe_step(5, 0.0102)
    speculator.begin_step(1)
    assert speculator.may_draft(request)
    assert speculator.propose(request, 10) == [4, 5, 1, 2]
    # Compute-bound steps: 256 and 512 tokens, cost in proportion.
    speculator.observe_step(256, 0.256)
    speculator.observe_step(512, 0.512)
    speculator.begin_step(256)
    assert not speculator.may_draft(request)
    assert speculator.propose(request, 10) == []


def test_counters_follow_what_the_steps_verified():
    speculator = Speculator(SpeculativeConfig(method="ngram", num_speculative_tokens=3))
    speculator.observe("a", num_drafted=3, num_accepted=3)
    speculator.observe("a", num_drafted=3, num_accepted=1)
    speculator.observe("a", num_drafted=2, num_accepted=0)
    stats = speculator.stats
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 8, 4)
    assert stats.num_accepted_tokens_per_pos == [2, 1, 1]
    assert stats.acceptance_length_counts == [1, 1, 0, 1]
    assert stats.mean_acceptance_length == 1 + 4 / 3


class _Rule:
    """An adaptive proposer whose rule says yes or no to every request."""

    def __init__(self, may: bool) -> None:
        self.may = may

    def begin_step(self, num_decodes: int) -> None:
        pass

    def may_draft(self, request: Request) -> bool:
        return self.may

    def propose(self, request: Request, max_num_tokens: int) -> list[int]:
        return [7, 8][:max_num_tokens]

    def observe(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        pass

    def release(self, request: Request) -> None:
        pass


def test_a_request_the_rule_will_not_draft_stays_overlapped():
    """With its token still in flight, a decode the rule would draft for waits for the step to
    be read (the proposer reads its tokens); one it would not is scheduled at once, without
    drafts, as with no speculation."""
    for may in (False, True):
        manager = KVCacheManager(num_blocks=64, block_size=4, enable_caching=True)
        scheduler = Scheduler(
            SchedulerConfig(), CacheConfig(block_size=4), manager, 256, proposer=_Rule(may)
        )
        scheduler.add_request(_request("a", [1, 2, 3]))
        first = scheduler.schedule()  # the prompt; its token is now in flight
        assert first.scheduled[0].samples
        second = scheduler.schedule()
        if may:
            assert second.scheduled == []
        else:
            assert [s.request_id for s in second.scheduled] == ["a"]
            assert second.scheduled[0].draft_token_ids == []
