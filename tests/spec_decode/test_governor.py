"""The speculation governor: per load level, the mode whose measured output rate is higher."""

from __future__ import annotations

import pytest

from ladle.spec_decode.governor import (
    EPOCH_STEPS,
    EXPLORE_EVERY,
    MAX_EXPLORE_EVERY,
    MAX_LEVEL_FIRST_ON,
    MIN_EPOCH_STEPS,
    WIN_MARGIN,
    SpeculationGovernor,
    load_level,
)


def test_load_levels_are_power_of_two_buckets():
    assert [load_level(n) for n in (0, 1, 2, 3, 4, 5, 8, 9, 200)] == [0, 1, 2, 4, 4, 8, 8, 16, 256]


def _drive(governor, num_running, num_steps, now, seconds_per_token):
    """Steps of 8 tokens each; seconds_per_token(speculating) says how long they take."""
    modes = []
    for _ in range(num_steps):
        speculating = governor.begin_step(num_running, now)
        modes.append(speculating)
        governor.observe_outputs(8)
        now += 8 * seconds_per_token(speculating)
    return modes, now


def test_it_measures_both_modes_then_keeps_the_faster_and_explores_the_other_rarely():
    for on_faster in (True, False):
        governor = SpeculationGovernor()
        modes, _ = _drive(
            governor, 3, 200 * EPOCH_STEPS, 0.0,
            lambda s, f=on_faster: 0.001 if s == f else 0.002,
        )
        epochs = modes[::EPOCH_STEPS]
        assert epochs[:2] == [True, False]  # one epoch of each first
        winner = [m == on_faster for m in epochs[2:]]
        # The loser runs one epoch in EXPLORE_EVERY, no more.
        assert winner.count(False) <= len(winner) // EXPLORE_EVERY + 1
        level = governor.levels[4]
        assert (level.rate_on > level.rate_off) == on_faster


def test_a_change_of_load_ends_the_epoch_and_levels_learn_apart():
    governor = SpeculationGovernor()
    now = 0.0
    # Level 1 learns that speculation doubles the rate.
    _, now = _drive(governor, 1, 8 * EPOCH_STEPS, now, lambda s: 0.001 if s else 0.002)
    # A few steps at 64 running, too few to count, then back.
    _, now = _drive(governor, 64, MIN_EPOCH_STEPS - 1, now, lambda s: 0.001)
    assert governor.levels[64].rate_on is None and governor.levels[64].num_epochs == 0
    assert governor.begin_step(1, now) is True
    # The level flips when its measurements do (the workload changed).
    modes, now = _drive(governor, 1, 40 * EPOCH_STEPS, now, lambda s: 0.004 if s else 0.002)
    last_epochs = modes[-10 * EPOCH_STEPS::EPOCH_STEPS]
    assert last_epochs.count(True) <= 1  # an exploration at most


def test_retries_that_confirm_the_answer_come_ever_more_rarely():
    governor = SpeculationGovernor()
    num_epochs = 2000
    modes, now = _drive(governor, 3, num_epochs * EPOCH_STEPS, 0.0,
                        lambda s: 0.002 if s else 0.001)
    epochs = modes[::EPOCH_STEPS]
    retries = epochs[2:].count(True)
    # Waits of 16, 32, ..., 256 epochs: about 2 + 2000 / 256 retries, not 2000 / 16 = 125.
    assert 3 <= retries <= 2 + num_epochs // MAX_EXPLORE_EVERY + 5
    assert governor.levels[4].explore_every == MAX_EXPLORE_EVERY
    # Speculation starts to pay (the mode not running got better): the next retry notices and
    # the level switches (the waits start over, then grow again as retries of "off" confirm).
    modes, _ = _drive(governor, 3, (MAX_EXPLORE_EVERY + 40) * EPOCH_STEPS, now,
                      lambda s: 0.0005 if s else 0.001)
    assert modes[-20 * EPOCH_STEPS::EPOCH_STEPS].count(False) <= 1


def test_a_new_level_starts_from_what_its_neighbours_measured():
    governor = SpeculationGovernor()
    now = 0.0
    # Speculation wins at 8 running and loses at 32 (each learnt over a few epochs).
    _, now = _drive(governor, 8, 6 * EPOCH_STEPS, now, lambda s: 0.001 if s else 0.002)
    _, now = _drive(governor, 32, 6 * EPOCH_STEPS, now, lambda s: 0.002 if s else 0.001)
    assert governor.levels[8].better_mode() is True
    assert governor.levels[32].better_mode() is False
    # A heavier load than one where it lost: off from the first epoch, on only once explored.
    modes, now = _drive(governor, 200, (EXPLORE_EVERY + 4) * EPOCH_STEPS, now,
                        lambda s: 0.002 if s else 0.001)
    epochs = modes[::EPOCH_STEPS]
    assert epochs[:EXPLORE_EVERY] == [False] * EXPLORE_EVERY
    assert epochs.count(True) == 1  # the exploration, after EXPLORE_EVERY epochs
    assert governor.levels[256].better_mode() is False
    # A lighter load than one where it won: on from the first epoch.
    modes, now = _drive(governor, 2, 4 * EPOCH_STEPS, now, lambda s: 0.001 if s else 0.002)
    assert modes[::EPOCH_STEPS] == [True] * 4
    # Between a win below and a loss above there is no hint: one epoch of each first.
    modes, now = _drive(governor, 16, 3 * EPOCH_STEPS, now, lambda s: 0.001 if s else 0.002)
    assert modes[::EPOCH_STEPS][:2] == [True, False]


def test_a_hint_that_was_wrong_is_undone_at_the_first_exploration():
    governor = SpeculationGovernor()
    now = 0.0
    _, now = _drive(governor, 4, 6 * EPOCH_STEPS, now, lambda s: 0.002 if s else 0.001)
    # At 64 running speculation wins after all (the hint said off).
    modes, now = _drive(governor, 64, (EXPLORE_EVERY + 12) * EPOCH_STEPS, now,
                        lambda s: 0.0005 if s else 0.001)
    epochs = modes[::EPOCH_STEPS]
    assert epochs[:EXPLORE_EVERY] == [False] * EXPLORE_EVERY
    assert epochs[EXPLORE_EVERY:] == [True] * 12  # explored, won, kept


def test_a_draining_batch_does_not_favour_the_mode_it_measured_first():
    """Requests finish while a level is measured: the mode measured first (on, at a new level
    without hints) runs with more requests. Each step takes 10 ms whatever the batch (not
    compute-bound) and gives one token a request; speculation costs 5% more a step and gives
    nothing more. Compared per request, off wins; compared as batch rates, on would (its epoch
    had ~16 more requests, about 10% more tokens a second)."""
    reports = []
    governor = SpeculationGovernor(report=reports.append)
    now, running = 0.0, 250
    while running > 150:
        speculating = governor.begin_step(running, now)
        governor.observe_outputs(running)
        now += 0.0105 if speculating else 0.010
        running -= 1
    level = governor.levels[256]
    assert level.rate_on is not None and level.rate_off is not None
    assert level.better_mode() is False
    assert reports[0].startswith("speculation off at <= 256 running")


def test_each_change_of_mind_is_reported_once():
    reports = []
    governor = SpeculationGovernor(report=reports.append)
    now = 0.0
    _, now = _drive(governor, 3, 6 * EPOCH_STEPS, now, lambda s: 0.001 if s else 0.002)
    assert reports == [reports[0]] and reports[0].startswith("speculation on at <= 4 running")
    # The workload changes: an exploration finds off better, once; then no more lines.
    _, now = _drive(governor, 3, (EXPLORE_EVERY + 40) * EPOCH_STEPS, now,
                    lambda s: 0.004 if s else 0.002)
    assert len(reports) == 2 and reports[1].startswith("speculation off at <= 4 running")
    assert governor.describe().startswith("speculation off at <= 4 running")


def _one_request_at_a_time(slow_step_offset: int) -> tuple[SpeculationGovernor, list[bool]]:
    """One request in flight: each new request's first step computes its prompt; the step at
    slow_step_offset from it takes 40 ms, decode steps 1 ms plain and 1.2 ms drafted for 2
    tokens. Returns the governor and each epoch's mode."""
    governor = SpeculationGovernor()
    now = 0.0
    epochs = []
    for step in range(8 * EPOCH_STEPS):
        speculating = governor.begin_step(1, now)
        if step % EPOCH_STEPS == 0:
            epochs.append(speculating)
        governor.observe_outputs(2 if speculating else 1, step % 200 == 0)
        slow = step % 200 == slow_step_offset
        now += 0.040 if slow else (0.0012 if speculating else 0.001)
    return governor, epochs


def test_a_prefill_in_the_first_epoch_does_not_decide_the_level():
    """The first epoch (on) holds a prefill: counted whole it would measure speculation at a
    fifth of off's rate."""
    governor, epochs = _one_request_at_a_time(slow_step_offset=0)
    assert epochs[:2] == [True, False]
    assert governor.levels[1].better_mode() is True
    assert epochs[2:] == [True] * 6


def test_where_every_step_computes_prompt_tokens_epochs_are_measured_whole():
    governor = SpeculationGovernor()
    now = 0.0
    for _ in range(4 * EPOCH_STEPS):
        speculating = governor.begin_step(100, now)
        governor.observe_outputs(100, True)
        now += 0.011 if speculating else 0.010
    level = governor.levels[128]
    assert level.rate_on is not None and level.better_mode() is False


def test_no_step_speculates_or_is_measured_while_prompts_back_up():
    governor = SpeculationGovernor()
    now = 0.0
    _, now = _drive(governor, 3, 4 * EPOCH_STEPS, now, lambda s: 0.001 if s else 0.002)
    assert governor.begin_step(3, now) is True  # speculation won here
    level = governor.levels[4]
    epochs_before, rate_on_before = level.num_epochs, level.rate_on
    for _ in range(10 * EPOCH_STEPS):  # a burst of arrivals: slow, prompt-heavy steps
        now += 0.050
        assert governor.begin_step(3, now, prefill_backlog=True) is False
        governor.observe_outputs(1, True)
    assert (level.num_epochs, level.rate_on) == (epochs_before, rate_on_before)
    assert governor.begin_step(3, now) is True  # the burst is admitted: on again


def test_the_pause_before_a_request_is_not_timed_as_a_step():
    """A benchmark's probe request, then seconds of nothing, then the run: the probe's last
    step must not be timed across the pause (it measured speculation at an eighth)."""
    governor = SpeculationGovernor()
    now = 0.0
    for _ in range(5):  # the probe: a few drafted steps
        governor.begin_step(1, now)
        governor.observe_outputs(2)
        now += 0.0012
    governor.went_idle()
    now += 5.0
    modes, now = _drive(governor, 1, 4 * EPOCH_STEPS, now, lambda s: 0.0006 if s else 0.001)
    assert governor.levels[1].better_mode() is True
    assert modes[::EPOCH_STEPS][2:] == [True, True]


def test_the_step_after_a_prompt_step_is_not_measured_either():
    """With overlapped scheduling the host waits for a step's tokens in the step after it: a
    40 ms prefill shows as the next step's time. Measured there, it would halve the rate of
    the mode whose epoch it fell in."""
    governor, epochs = _one_request_at_a_time(slow_step_offset=1)
    assert epochs[:2] == [True, False]
    assert governor.levels[1].better_mode() is True


def test_the_trace_records_each_epoch_as_it_was_measured():
    records = []
    governor = SpeculationGovernor(trace=records.append)
    now = 0.0
    for step in range(2 * EPOCH_STEPS + 1):
        speculating = governor.begin_step(1, now)
        governor.observe_outputs(2 if speculating else 1, step == 0)
        now += 0.002
    assert [r["speculating"] for r in records] == [True, False]
    first = records[0]
    assert (first["level"], first["steps"], first["decode_steps"]) == (1, EPOCH_STEPS, 14)
    # The prompt step and the one after it are left out of the rate (not of the epoch).
    assert first["rate"] == pytest.approx(first["decode_tokens"] / first["decode_seconds"])
    assert first["decode_tokens"] == 2 * 14 and first["tokens"] == 2 * EPOCH_STEPS


def test_the_trace_goes_to_the_file_the_environment_names(tmp_path, monkeypatch):
    import json

    from ladle.spec_decode.governor_trace import governor_trace_from_env

    monkeypatch.delenv("LADLE_SPEC_GOVERNOR_TRACE", raising=False)
    assert governor_trace_from_env() is None
    path = tmp_path / "trace.jsonl"
    monkeypatch.setenv("LADLE_SPEC_GOVERNOR_TRACE", str(path))
    governor = SpeculationGovernor(trace=governor_trace_from_env())
    _drive(governor, 2, 3 * EPOCH_STEPS, 0.0, lambda s: 0.001)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["level"] for line in lines] == [2, 2]  # the third epoch has not ended


def test_a_tie_goes_to_plain_steps():
    """Speculation that measures faster by less than WIN_MARGIN (here by half of it) does not
    run beyond its explorations; by twice the margin it runs."""
    for gain, expected in ((WIN_MARGIN / 2, False), (2 * WIN_MARGIN, True)):
        governor = SpeculationGovernor()
        modes, _ = _drive(governor, 3, 100 * EPOCH_STEPS, 0.0,
                          lambda s, g=gain: 0.001 / (1 + g) if s else 0.001)  # fmt: skip
        assert governor.levels[4].better_mode() is expected
        later = modes[10 * EPOCH_STEPS :: EPOCH_STEPS]
        assert later.count(expected) >= len(later) - len(later) // EXPLORE_EVERY - 1


def test_a_heavy_first_level_starts_with_plain_steps():
    """The first level measured is a heavy one (a burst of 256 requests): its first epoch runs
    plain steps and the drafted one follows, where a light level's first epoch drafts."""
    heavy = 4 * MAX_LEVEL_FIRST_ON
    for running, first in ((heavy, False), (MAX_LEVEL_FIRST_ON, True)):
        governor = SpeculationGovernor()
        modes, _ = _drive(governor, running, 3 * EPOCH_STEPS, 0.0,
                          lambda s: 0.002 if s else 0.001)  # fmt: skip
        assert modes[::EPOCH_STEPS][:2] == [first, not first]
        assert governor.levels[load_level(running)].better_mode() is False
