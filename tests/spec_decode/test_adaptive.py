"""The adaptive draft length: the draft positions a request's acceptance makes worth verifying."""

from __future__ import annotations

import pytest

from ladle.spec_decode.adaptive import (
    CHEAP_POSITION_CHANCE,
    CHEAP_STEP_TOKENS,
    MIN_POSITION_CHANCE,
    PRIOR_ACCEPTANCE,
    AcceptanceEstimate,
    draft_length,
    expected_extra_tokens,
    min_position_chance,
)


def test_expected_extra_tokens():
    assert expected_extra_tokens(0.5, 0) == 0
    assert expected_extra_tokens(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_extra_tokens(1.0, 4) == 4


def test_draft_length_keeps_the_positions_likely_to_be_accepted():
    # a^d >= MIN_POSITION_CHANCE: each kept position is reached and accepted often enough.
    for acceptance in (0.05, 0.3, 0.5, 0.6, 0.8, 0.95):
        length = draft_length(acceptance, 16)
        assert acceptance**length >= MIN_POSITION_CHANCE or length == 0
        assert length == 16 or acceptance ** (length + 1) < MIN_POSITION_CHANCE
    assert draft_length(0.5, 4) == 2 and draft_length(0.6, 4) == 3
    assert draft_length(0.95, 4) == 4  # capped by the configured k
    assert draft_length(0.1, 4) == 0


def test_a_step_that_fits_the_smallest_bucket_verifies_unlikely_positions_too():
    # k = 4: 1 to 3 requests fill at most 15 of the bucket's 16 tokens at full length.
    assert CHEAP_STEP_TOKENS == 16
    assert [min_position_chance(n, 4) for n in (1, 3, 4, 64)] == [
        CHEAP_POSITION_CHANCE, CHEAP_POSITION_CHANCE, MIN_POSITION_CHANCE, MIN_POSITION_CHANCE,
    ]
    assert min_position_chance(1, 15) == CHEAP_POSITION_CHANCE
    assert min_position_chance(1, 16) == MIN_POSITION_CHANCE  # 17 tokens: the next bucket
    # At acceptance 0.6: all 4 positions (0.6^4 = 0.13) instead of 3, for 6% more tokens.
    cheap = draft_length(0.6, 4, CHEAP_POSITION_CHANCE)
    assert cheap == 4 and draft_length(0.6, 4) == 3
    gain = (1 + expected_extra_tokens(0.6, 4)) / (1 + expected_extra_tokens(0.6, 3))
    assert gain == pytest.approx(1.06, abs=0.005)
    assert draft_length(0.04, 4, CHEAP_POSITION_CHANCE) == 0


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
