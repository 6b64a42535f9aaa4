"""Adaptive draft length: how many drafts a request gets this step, from its measured
acceptance and from what tokens cost in a step of this size.

Speculation pays when a step is memory-bound (one more token in it costs almost nothing) and
loses when it is compute-bound (each token costs its share): at batch 1 on a GPU four drafts
are nearly free, at batch 256 they make every request's step slower for tokens that are often
rejected. So the rule compares the step's output rate with and without a request's drafts:

    rate(d) = (outputs + expected_extra_tokens(a, d)) / step_seconds(tokens + d)

where `outputs` and `tokens` are the step's without this request's drafts, a is the request's
per-draft acceptance and step_seconds the measured cost of a step of that many tokens
(step_cost.py). The request gets the d in 0..max_k with the highest rate: the expected accepted
tokens per unit of step cost. Drafts are modelled as accepted independently with probability a
each, up to the first rejection, so d drafts yield a + a^2 + ... + a^d extra tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Before a request has been drafted: a neutral acceptance, worth a few drafted positions.
PRIOR_ACCEPTANCE = 0.5
PRIOR_WEIGHT = 2.0
# Each observation (and each step without drafts) keeps this share of the evidence: a request
# that stopped being drafted drifts back to the prior and is tried again.
EVIDENCE_DECAY = 0.9


def expected_extra_tokens(acceptance: float, num_drafts: int) -> float:
    """Expected accepted drafts among num_drafts, each accepted with probability acceptance
    given the ones before it were: a + a^2 + ... + a^d."""
    return sum(acceptance**position for position in range(1, num_drafts + 1))


def choose_draft_length(
    acceptance: float,
    max_num_drafts: int,
    num_step_tokens: int,
    num_step_outputs: int,
    step_seconds: Callable[[int], float],
) -> int:
    """The draft length in 0..max_num_drafts with the most expected output tokens per second of
    step (ties go to fewer drafts). num_step_tokens / num_step_outputs: the step's tokens and
    expected outputs without this request's drafts (its own next token included)."""
    best_length = 0
    best_rate = num_step_outputs / step_seconds(num_step_tokens)
    for length in range(1, max_num_drafts + 1):
        rate = (num_step_outputs + expected_extra_tokens(acceptance, length)) / step_seconds(
            num_step_tokens + length
        )
        if rate > best_rate * (1 + 1e-9):
            best_length, best_rate = length, rate
    return best_length


@dataclass
class AcceptanceEstimate:
    """One request's per-draft acceptance: accepted / tested positions, decayed, with a prior.

    A step with d drafts and m accepted tested m + 1 positions (the first rejection ends it)
    unless all d were accepted (then d): the maximum-likelihood estimate of a geometric run."""

    num_accepted: float = 0.0
    num_tested: float = 0.0

    @property
    def rate(self) -> float:
        return (self.num_accepted + PRIOR_ACCEPTANCE * PRIOR_WEIGHT) / (
            self.num_tested + PRIOR_WEIGHT
        )

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        self.decay()
        self.num_accepted += num_accepted
        self.num_tested += num_accepted + (1 if num_accepted < num_drafted else 0)

    def decay(self) -> None:
        self.num_accepted *= EVIDENCE_DECAY
        self.num_tested *= EVIDENCE_DECAY
