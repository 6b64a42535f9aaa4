"""The Speculator between the scheduler and the proposers: speculation on where it measures faster,
the counters, and the overlap kept for requests the rule would not draft for."""

from __future__ import annotations

from ladle.config import CacheConfig, SchedulerConfig, SpeculativeConfig
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.request import Request
from ladle.core.scheduler import Scheduler
from ladle.sampling.params import SamplingParams
from ladle.spec_decode.governor import EPOCH_STEPS, EXPLORE_EVERY
from ladle.spec_decode.speculator import Speculator


def _request(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id, tokens, SamplingParams(max_tokens=50))


def _run_epochs(speculator: Speculator, num_running: int, steps: int, clock: list[float],
                rate_on: float, rate_off: float) -> list[bool]:
    """Steps on a made-up clock: each step yields 10 tokens in the time the mode's rate says."""
    modes = []
    for _ in range(steps):
        speculator.begin_step(num_running)
        modes.append(speculator.speculating)
        clock[0] += 10 / (rate_on if speculator.speculating else rate_off)
        speculator.observe_outputs(10)
    return modes


def test_the_governor_keeps_speculation_where_it_measures_faster(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("ladle.spec_decode.speculator.time.perf_counter", lambda: clock[0])
    speculator = Speculator(SpeculativeConfig(method="ngram", num_speculative_tokens=4))
    request = _request("a", [1, 2, 3, 4, 5, 1, 2, 3])
    # Batch 1: speculation doubles the rate; at 256 running it halves it.
    small = _run_epochs(speculator, 1, 64 * EPOCH_STEPS, clock, rate_on=2000, rate_off=1000)
    large = _run_epochs(speculator, 256, 64 * EPOCH_STEPS, clock, rate_on=500, rate_off=1000)
    assert sum(small[4 * EPOCH_STEPS:]) / len(small[4 * EPOCH_STEPS:]) >= 1 - 1.5 / EXPLORE_EVERY
    assert sum(large[4 * EPOCH_STEPS:]) / len(large[4 * EPOCH_STEPS:]) <= 1.5 / EXPLORE_EVERY
    # Each level kept its own answer: back at batch 1 the step speculates, and drafts.
    speculator.begin_step(1)
    assert speculator.speculating and speculator.may_draft(request)
    # The prior acceptance (0.5): 4 drafts in a step this small (adaptive.py: its verified
    # positions cost nothing), 2 where each costs a token of the step.
    assert speculator.propose(request, 10) == [4, 5, 1, 2]
    speculator.begin_step(8)
    assert speculator.propose(request, 10) == [4, 5]
    speculator.begin_step(256)
    assert not speculator.speculating and not speculator.may_draft(request)
    assert speculator.propose(request, 10) == []
    assert "<= 1 running" in speculator.governor.describe()


def test_without_adaptive_every_step_drafts_the_full_length():
    speculator = Speculator(
        SpeculativeConfig(method="ngram", num_speculative_tokens=3, adaptive=False)
    )
    request = _request("a", [1, 2, 3, 4, 5, 1, 2, 3])
    for num_running in (1, 512):
        speculator.begin_step(num_running)
        assert speculator.may_draft(request)
        assert speculator.propose(request, 10) == [4, 5, 1]


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

    def begin_step(self, num_decodes: int, prefill_backlog: bool = False) -> bool:
        return self.may

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


def test_a_stats_snapshot_is_not_changed_by_later_counting():
    speculator = Speculator(SpeculativeConfig(method="ngram", num_speculative_tokens=3))
    speculator.observe("a", num_drafted=3, num_accepted=2)
    snapshot = speculator.stats.snapshot()
    assert snapshot == speculator.stats
    speculator.observe("a", num_drafted=3, num_accepted=3)
    assert snapshot.num_drafts == 1 and snapshot.num_accepted_tokens == 2
    assert snapshot.num_accepted_tokens_per_pos == [1, 1, 0]
    assert snapshot.acceptance_length_counts == [0, 0, 1, 0]
    assert speculator.stats.num_accepted_tokens_per_pos == [2, 2, 1]
