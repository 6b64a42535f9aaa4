"""The adaptive draft length: the draft positions a request's acceptance makes worth verifying."""

from __future__ import annotations

import pytest

from ladle.spec_decode.adaptive import (
    MIN_POSITION_CHANCE,
    PRIOR_ACCEPTANCE,
    AcceptanceEstimate,
    draft_length,
    expected_extra_tokens,
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
