"""TTFT-SLO admission against a known prefill rate, the step meter that measures that rate, and
the live stats line of `ladle serve`."""

from __future__ import annotations

import dataclasses

import pytest

from ladle.core.request import Request
from ladle.engine.step_meter import StepMeter, split_scheduled_tokens
from ladle.entrypoints.openai.live_stats import LiveStatsLogger
from ladle.frontend.admission import AdmissionController, QueueFullError
from ladle.frontend.slo_admission import HEADROOM, TtftSloAdmission
from ladle.protocol.messages import SchedulerStats, SpecDecodeStats
from ladle.sampling.params import SamplingParams


def _admission(rate: float, slo_s: float = 1.0) -> TtftSloAdmission:
    stats = SchedulerStats(prefill_tokens_per_s=rate)
    return TtftSloAdmission(AdmissionController(None, None), slo_s, lambda: stats)


def test_refuses_what_the_queue_ahead_would_make_late_with_a_computed_retry_after():
    admission = _admission(rate=1000.0)  # 1000 prompt tokens/s, SLO 1 s, admit up to 0.8 s
    admission.admit("a", 1, 500)
    admission.admit("b", 1, 300)  # (500 + 300) / 1000 = 0.8 s: just in time
    with pytest.raises(QueueFullError, match="exceeds the TTFT SLO") as refused:
        admission.admit("c", 1, 700)  # (800 + 700) / 1000 = 1.5 s predicted
    # The queue must drain 800 + 700 - 0.8 * 1000 = 700 tokens first: 0.7 s, rounded up.
    assert refused.value.retry_after_seconds == 1
    with pytest.raises(QueueFullError) as refused:
        admission.admit("d", 1, 3000)
    assert refused.value.retry_after_seconds == 3  # (800 + 3000 - 800) / 1000
    assert admission.num_refused == 2
    assert admission.num_queued_prompt_tokens == 800
    admission.release("a")  # its first token came back: 500 tokens fewer ahead
    admission.admit("c", 1, 500)
    assert admission.num_queued_prompt_tokens == 800
    assert admission.predicted_ttft(0) == pytest.approx(0.8)
    assert HEADROOM == 0.8


def test_admits_with_nothing_ahead_or_no_measured_rate():
    admission = _admission(rate=100.0, slo_s=0.5)
    admission.admit("huge", 1, 10_000)  # alone it misses anyway; refusing would not help
    unmeasured = _admission(rate=0.0)
    unmeasured.admit("a", 1, 10_000)
    unmeasured.admit("b", 1, 10_000)  # no rate yet: no prediction, no refusal
    with pytest.raises(QueueFullError):
        admission.check(1, 10)  # check() (the routes' all-or-nothing test) applies it too


def test_the_wrapped_queue_bounds_still_apply():
    stats = SchedulerStats(prefill_tokens_per_s=1e9)
    admission = TtftSloAdmission(AdmissionController(1, None), 1.0, lambda: stats)
    admission.admit("a", 1, 10)
    with pytest.raises(QueueFullError, match="max_queued_requests"):
        admission.admit("b", 1, 10)
    assert admission.max_queued_requests == 1  # the wrapped controller's attributes show through


def test_step_meter_splits_prompt_from_decode_tokens_and_averages_the_rate():
    prefilling = Request("p", list(range(1, 101)), SamplingParams())
    decoding = Request("d", [1, 2, 3], SamplingParams())
    decoding.num_computed_tokens = 3
    decoding.append_output_token(7)
    assert split_scheduled_tokens([prefilling, decoding], {"p": 64, "d": 1}) == (64, 1)
    meter = StepMeter()
    meter.record(64, 1, 0.1)  # 640 prompt tokens/s
    assert meter.prefill_tokens_per_s == pytest.approx(640.0)
    meter.record(0, 5, 0.05)  # a decode-only step leaves the prefill rate alone
    assert meter.prefill_tokens_per_s == pytest.approx(640.0)
    meter.record(100, 0, 0.1)  # 1000 tokens/s, weighted 0.1
    assert meter.prefill_tokens_per_s == pytest.approx(0.9 * 640 + 0.1 * 1000)
    assert (meter.num_prefill_tokens, meter.num_decode_tokens) == (164, 6)


def test_live_stats_line_over_the_interval_and_refusals():
    snapshots = [SchedulerStats()]
    lines: list[str] = []
    clock = [0.0]
    logger = LiveStatsLogger(lambda: snapshots[-1], 5.0, lines.append, lambda: clock[0])
    clock[0] = 5.0
    assert logger.line() is None  # idle: nothing to say
    snapshots.append(
        SchedulerStats(
            num_running_reqs=3,
            num_waiting_reqs=2,
            kv_cache_usage=0.25,
            prefix_cache_queries=200,
            prefix_cache_hits=50,
            num_prefill_tokens=1000,
            num_decode_tokens=100,
        )
    )
    logger.record_refusal(429, "predicted time to first token 3s exceeds the TTFT SLO 1s")
    logger.record_refusal(429, "again")  # within a second: counted, not logged
    assert lines == [
        "[ladle] refused a request (429): predicted time to first token 3s exceeds the TTFT SLO 1s"
    ]
    clock[0] = 10.0
    assert logger.line() == (
        "[ladle] running 3 reqs, waiting 2 reqs, KV cache 25.0%, prefix cache hit rate 25.0%, "
        "prompt 200.0 tokens/s, generation 20.0 tokens/s, refused 2"
    )


def test_a_full_running_batch_makes_the_queue_position_the_wait():
    """Regression: with max_num_seqs running, a queued request waits for running ones to
    finish; the prompt-token prediction alone (a fast prefill) admitted everything, and on the
    CPU (max_num_seqs 2, --ttft-slo 1s, 4 req/s of 300-token replies) 14 of 16 admitted requests
    then missed the SLO with a TTFT p99 of 10.7 s."""
    now = [0.0]
    inner = AdmissionController(None, None, clock=lambda: now[0])
    stats = SchedulerStats(prefill_tokens_per_s=1e6, num_running_reqs=0)
    admission = TtftSloAdmission(inner, 1.0, lambda: stats, max_num_seqs=2)
    admission.admit("a", 1, 64)
    admission.admit("b", 1, 64)  # room in the batch: both let in
    stats.num_running_reqs = 2
    now[0] = 1.0
    admission.release("a")
    now[0] = 2.0
    admission.release("b")  # 2 queued requests started in the last 2 s: 1 per second
    admission.admit("c", 1, 64)  # nothing queued ahead: always let in
    # "d" would start after "c" and itself: (1 + 1) / 1 per s = 2 s > 0.8 s.
    assert admission.predicted_ttft(64) == pytest.approx(2.0)
    with pytest.raises(QueueFullError, match="running batch full") as refused:
        admission.admit("d", 1, 64)
    assert refused.value.retry_after_seconds == 2  # ceil(2 - 0.8)
    # The same queue with room in the batch: prefill alone decides, and it is fast.
    stats.num_running_reqs = 1
    assert admission.predicted_ttft(64) == pytest.approx(128 / 1e6)
    admission.admit("d", 1, 64)
    # Without a known batch bound (the old behaviour), a full batch is never assumed.
    stats.num_running_reqs = 2
    unbounded = TtftSloAdmission(AdmissionController(None, None), 1.0, lambda: stats)
    assert unbounded.slot_wait() == 0.0


def test_a_full_batch_that_started_nothing_lately_refuses_a_queued_request():
    stats = SchedulerStats(prefill_tokens_per_s=1e6, num_running_reqs=4)
    admission = TtftSloAdmission(AdmissionController(None, None), 1.0, lambda: stats, 4)
    admission.admit("a", 1, 10)
    with pytest.raises(QueueFullError, match="0.00 starting per second") as refused:
        admission.admit("b", 1, 10)
    assert refused.value.retry_after_seconds == 60


def test_live_stats_add_vllms_spec_decoding_line_over_the_interval():
    def spec(drafts, drafted, accepted, per_position):
        return SpecDecodeStats(
            num_drafts=drafts,
            num_draft_tokens=drafted,
            num_accepted_tokens=accepted,
            num_accepted_tokens_per_pos=per_position,
            acceptance_length_counts=[0] * 5,
        )

    snapshots = [SchedulerStats(spec_decode=spec(10, 40, 20, [8, 6, 4, 2]))]
    clock = [0.0]
    logger = LiveStatsLogger(lambda: snapshots[-1], 5.0, lambda line: None, lambda: clock[0])
    snapshots.append(
        SchedulerStats(num_running_reqs=1, num_decode_tokens=50,
                       spec_decode=spec(30, 120, 50, [24, 15, 8, 3]))
    )  # fmt: skip
    clock[0] = 10.0
    main, spec_line = logger.line().split("\n")
    assert main.startswith("[ladle] running 1 reqs")
    # Over the interval: 20 drafted steps, 80 drafts, 30 accepted.
    assert spec_line == (
        "[ladle] SpecDecoding metrics: Mean acceptance length: 2.50, Accepted throughput: "
        "3.00 tokens/s, Drafted throughput: 8.00 tokens/s, Accepted: 30 tokens, Drafted: 80 "
        "tokens, Per-position acceptance rate: 0.800, 0.450, 0.200, 0.050, Avg Draft "
        "acceptance rate: 37.5%"
    )
    snapshots.append(dataclasses.replace(snapshots[-1], num_decode_tokens=60))
    clock[0] = 15.0
    assert "\n" not in logger.line()  # nothing verified in this interval: no second line
