"""The speculation governor: per load level, the mode whose measured output rate is higher."""

from __future__ import annotations

from ladle.spec_decode.governor import (
    EPOCH_STEPS,
    EXPLORE_EVERY,
    MAX_EXPLORE_EVERY,
    MIN_EPOCH_STEPS,
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
