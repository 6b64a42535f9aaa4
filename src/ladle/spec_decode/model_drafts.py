"""Host-side proposers for drafts a network computed in the worker (draft model, EAGLE head),
and method "auto", which picks per request between those and suffix drafts.

The worker drafts right after a step (worker/drafter.py) and the drafts come back with the
step's result; ModelDraftStore keeps each request's latest drafts, tagged with the request's
token count they follow, and hands them to the scheduler for the next step: drafts made for
another token count (a step read out of order, a preemption) are never used.
"""

from __future__ import annotations

from collections.abc import Sequence

from ladle.spec_decode.adaptive import AcceptanceEstimate, expected_extra_tokens
from ladle.spec_decode.suffix import SuffixProposer


class ModelDraftStore:
    """The latest model drafts per request (a TokenProposer of what the worker drafted)."""

    # The scheduler reserves lookahead slots for requests of a proposer with this set.
    drafts_in_worker = True

    def __init__(self) -> None:
        self._drafts: dict[str, tuple[int, list[int]]] = {}

    def store(self, request_id: str, num_tokens: int, draft_token_ids: list[int]) -> None:
        """The worker drafted these tokens to follow the request's first num_tokens tokens."""
        self._drafts[request_id] = (num_tokens, list(draft_token_ids))

    def has_drafts(self, request_id: str, num_tokens: int) -> bool:
        stored = self._drafts.get(request_id)
        return stored is not None and stored[0] == num_tokens and bool(stored[1])

    def propose_from(
        self, request_id: str, tokens: Sequence[int], max_num_tokens: int
    ) -> list[int]:
        stored = self._drafts.pop(request_id, None)
        if stored is None or stored[0] != len(tokens):
            return []
        return stored[1][:max_num_tokens]

    def wants_model_drafts(self, request_id: str) -> bool:
        return True

    def observe(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        return None

    def release(self, request_id: str, output_token_ids: Sequence[int]) -> None:
        self._drafts.pop(request_id, None)


# Acceptance a source starts from before any of the request's steps measured it.
_SUFFIX = "suffix"
_MODEL = "model"


class AutoProposer:
    """method "auto" with a model: per request, suffix drafts or the network's, whichever
    promises more accepted tokens by that request's measured acceptance of each (the same
    estimates the adaptive length uses). Suffix drafts cost no device time; the network's
    drafting is only asked for (lookahead) while the network is the request's better source
    or suffix has found nothing to propose."""

    drafts_in_worker = True

    def __init__(self, suffix: SuffixProposer, model: ModelDraftStore) -> None:
        self.suffix = suffix
        self.model = model
        self._rates: dict[tuple[str, str], AcceptanceEstimate] = {}
        self._last_source: dict[str, str] = {}
        self._suffix_missed: set[str] = set()

    def _estimate(self, request_id: str, source: str) -> AcceptanceEstimate:
        key = (request_id, source)
        if key not in self._rates:
            self._rates[key] = AcceptanceEstimate()
        return self._rates[key]

    def wants_model_drafts(self, request_id: str) -> bool:
        """Whether the network should draft for the request after this step."""
        if request_id in self._suffix_missed:
            return True
        model_rate = self._estimate(request_id, _MODEL).rate
        suffix_rate = self._estimate(request_id, _SUFFIX).rate
        return model_rate >= suffix_rate

    def store(self, request_id: str, num_tokens: int, draft_token_ids: list[int]) -> None:
        self.model.store(request_id, num_tokens, draft_token_ids)

    def propose_from(
        self, request_id: str, tokens: Sequence[int], max_num_tokens: int
    ) -> list[int]:
        suffix = self.suffix.propose_from(request_id, tokens, max_num_tokens)
        model = self.model.propose_from(request_id, tokens, max_num_tokens)
        if suffix:
            self._suffix_missed.discard(request_id)
        else:
            self._suffix_missed.add(request_id)
        suffix_gain = expected_extra_tokens(self._estimate(request_id, _SUFFIX).rate, len(suffix))
        model_gain = expected_extra_tokens(self._estimate(request_id, _MODEL).rate, len(model))
        if model and model_gain > suffix_gain:
            self._last_source[request_id] = _MODEL
            return model
        self._last_source[request_id] = _SUFFIX
        return suffix

    def observe(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        source = self._last_source.get(request_id)
        if source is not None:
            self._estimate(request_id, source).observe(num_drafted, num_accepted)

    def release(self, request_id: str, output_token_ids: Sequence[int]) -> None:
        self.suffix.release(request_id, output_token_ids)
        self.model.release(request_id, output_token_ids)
        self._last_source.pop(request_id, None)
        self._suffix_missed.discard(request_id)
        for source in (_SUFFIX, _MODEL):
            self._rates.pop((request_id, source), None)

    def forget_history(self) -> None:
        self.suffix.forget_history()
