"""Adaptive draft length: how many drafts a request gets in a step that speculates, from its
measured acceptance (whether a step speculates at all is the governor's, governor.py).

Drafts are modelled as accepted independently with probability a each, up to the first
rejection, so the d-th draft is reached and accepted with probability a^d: the request gets
every draft position whose chance is at least MIN_POSITION_CHANCE (a = 0.5, the prior: 2 drafts;
0.6: 3; 0.8: 7, capped by num_speculative_tokens), none when its acceptance is below it. A
verified position that is rejected costs a token of the step and gives nothing; the governor
measures whether the positions that pass this rule pay at the current load.

A step so small that it fits the smallest prefill-graph bucket at full length (CHEAP_STEP_TOKENS:
1 to 3 requests at k = 4) costs the same whatever its drafts, since the graph runs the whole
bucket: a position is then worth verifying at a much lower chance (CHEAP_POSITION_CHANCE). At
acceptance 0.6 and k = 4 the rule above stops at 3 drafts (2.18 tokens a step expected), all 4
give 2.31, for nothing: 6% more tokens from each batch-1 verify step.
"""

from __future__ import annotations

from dataclasses import dataclass

# A draft position is verified when the chance that it is reached and accepted is at least this.
MIN_POSITION_CHANCE = 0.2
# ... and in a step of at most CHEAP_STEP_TOKENS tokens at full length (worker/prefill_graphs.py's
# smallest bucket), where a verified position costs nothing.
CHEAP_STEP_TOKENS = 16
CHEAP_POSITION_CHANCE = 0.05
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


def min_position_chance(num_running: int, num_speculative_tokens: int) -> float:
    """The chance a draft position needs to be verified in a step of num_running requests."""
    if num_running * (num_speculative_tokens + 1) <= CHEAP_STEP_TOKENS:
        return CHEAP_POSITION_CHANCE
    return MIN_POSITION_CHANCE


def draft_length(
    acceptance: float, max_num_drafts: int, min_chance: float = MIN_POSITION_CHANCE
) -> int:
    """The drafts worth verifying for a request with this per-draft acceptance: the positions
    reached and accepted with probability >= min_chance, at most max_num_drafts."""
    length, chance = 0, 1.0
    while length < max_num_drafts:
        chance *= acceptance
        if chance < min_chance:
            break
        length += 1
    return length


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
