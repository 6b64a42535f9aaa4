"""The adaptive draft length: expected accepted tokens per unit of step cost."""

from __future__ import annotations

import pytest

from ladle.spec_decode.adaptive import (
    PRIOR_ACCEPTANCE,
    AcceptanceEstimate,
    choose_draft_length,
    expected_extra_tokens,
)
from ladle.spec_decode.step_cost import StepCostModel


def test_expected_extra_tokens():
    assert expected_extra_tokens(0.5, 0) == 0
    assert expected_extra_tokens(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_extra_tokens(1.0, 4) == 4


def _memory_bound(num_tokens: int) -> float:
    return 10.0 + 0.01 * num_tokens  # a batch-1 GPU decode: tokens almost free


def _compute_bound(num_tokens: int) -> float:
    return 0.1 * num_tokens  # every token costs its share


def test_memory_bound_steps_draft_the_most():
    assert choose_draft_length(0.8, 4, 1, 1, _memory_bound) == 4
    assert choose_draft_length(0.3, 4, 1, 1, _memory_bound) == 4  # still nearly free


def test_compute_bound_steps_do_not_draft():
    assert choose_draft_length(0.9, 8, 256, 256, _compute_bound) == 0


def test_the_rule_weighs_acceptance_against_cost():
    """A step whose tokens cost a third of the fixed part: good drafters draft, poor ones not."""

    def cost(num_tokens: int) -> float:
        return 1.0 + 0.3 * num_tokens

    assert choose_draft_length(0.9, 4, 1, 1, cost) == 4
    assert choose_draft_length(0.2, 4, 1, 1, cost) == 0
    # Brute force: the chosen length maximises (outputs + gain) / cost.
    for acceptance in (0.3, 0.5, 0.7):
        rates = [(1 + expected_extra_tokens(acceptance, d)) / cost(1 + d) for d in range(5)]
        assert choose_draft_length(acceptance, 4, 1, 1, cost) == rates.index(max(rates))


def test_acceptance_estimate_learns_and_returns_to_the_prior():
    estimate = AcceptanceEstimate()
    assert estimate.rate == PRIOR_ACCEPTANCE
    for _ in range(30):
        estimate.observe(num_drafted=4, num_accepted=4)
    assert estimate.rate > 0.9
    for _ in range(30):
        estimate.observe(num_drafted=4, num_accepted=0)
    assert estimate.rate < 0.25
    for _ in range(100):
        estimate.decay()  # steps without drafts
    assert abs(estimate.rate - PRIOR_ACCEPTANCE) < 0.05


def test_step_cost_model_interpolates_and_extends():
    model = StepCostModel()
    assert model.step_seconds(7) == 1.0  # nothing measured
    model.observe(4, 0.010)
    assert model.step_seconds(20) == 0.010  # one count: flat
    model.observe(8, 0.018)
    assert model.step_seconds(6) == pytest.approx(0.014)
    assert model.step_seconds(12) == pytest.approx(0.026)  # the line through the two largest
    model.observe(8, 0.028)  # a moving average, not the last value
    assert 0.018 < model.step_seconds(8) < 0.028
