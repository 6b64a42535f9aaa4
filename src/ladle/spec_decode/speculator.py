"""The Speculator: what the scheduler asks for drafts (core/draft_proposer.py's DraftProposer),
with the adaptive draft length and the counters behind the spec-decode metrics.

Per step the scheduler calls begin_step(number of running requests), then propose() per decode
it schedules, and after the step is read observe() per drafted request; release() when a request
ends. The engine feeds each step call's new tokens to observe_outputs() (the governor's measure
of whether speculation pays at this load).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from ladle.config import SpeculativeConfig
from ladle.protocol.messages import SpecDecodeStats
from ladle.spec_decode.adaptive import (
    MIN_POSITION_CHANCE,
    AcceptanceEstimate,
    draft_length,
    min_position_chance,
)
from ladle.spec_decode.governor import SpeculationGovernor
from ladle.spec_decode.model_drafts import AutoProposer, ModelDraftStore
from ladle.spec_decode.ngram import NgramProposer
from ladle.spec_decode.suffix import SuffixProposer

if TYPE_CHECKING:
    from ladle.core.request import Request


class TokenProposer(Protocol):
    """A model-free proposer over one request's tokens (ngram.py, suffix.py)."""

    def propose_from(
        self, request_id: str, tokens: Sequence[int], max_num_tokens: int
    ) -> list[int]: ...

    def release(self, request_id: str, output_token_ids: Sequence[int]) -> None: ...


def build_token_proposer(config: SpeculativeConfig) -> TokenProposer:
    """The host-side proposer: model-free drafts, the store of the worker's model drafts, or
    auto's choice between them (auto without a model: suffix drafts, adaptive as always)."""
    if config.method == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    suffix = SuffixProposer(
        config.prompt_lookup_min, config.prompt_lookup_max, config.suffix_max_cached_requests
    )
    if config.method == "suffix" or (config.method == "auto" and not config.uses_model_drafts):
        return suffix
    if config.method == "auto":
        return AutoProposer(suffix, ModelDraftStore())
    if config.uses_model_drafts:
        return ModelDraftStore()
    raise ValueError(f"speculative_config.method {config.method!r} has no proposer")


class Speculator:
    def __init__(
        self,
        config: SpeculativeConfig,
        proposer: TokenProposer | None = None,
        report: Callable[[str], None] | None = None,
        trace: Callable[[dict], None] | None = None,
    ) -> None:
        """report: where the governor's changes of mind go (one line each; None: nowhere);
        trace: where its epochs go (governor.py)."""
        self.config = config
        self.proposer = proposer if proposer is not None else build_token_proposer(config)
        # A class attribute of the proposer's: read once, not per request per step.
        self._drafts_in_worker = bool(getattr(self.proposer, "drafts_in_worker", False))
        self.report, self.trace = report, trace
        self.governor = SpeculationGovernor(report, trace)
        self.acceptance: dict[str, AcceptanceEstimate] = {}
        self.stats = SpecDecodeStats.empty(config.num_speculative_tokens)
        self.speculating = True  # this step's: the governor's choice when adaptive
        self.min_position_chance = MIN_POSITION_CHANCE  # this step's (adaptive.py)

    def begin_step(self, num_running: int, prefill_backlog: bool = False) -> bool:
        """A new step is being scheduled with this many running requests (prefill_backlog:
        more prompt tokens wait than one step computes); whether any request may get drafts
        in it (False while the governor has speculation off)."""
        if self.config.adaptive:
            self.speculating = self.governor.begin_step(
                num_running, time.perf_counter(), prefill_backlog
            )
            self.min_position_chance = min_position_chance(
                num_running, self.config.num_speculative_tokens
            )
        return self.speculating or not self.config.adaptive

    def went_idle(self) -> None:
        """The engine has no request left: what comes next starts after a pause."""
        self.governor.went_idle()

    def observe_outputs(self, num_tokens: int, with_prompt: bool = False) -> None:
        """A step call returned num_tokens new tokens, and the step it launched computed
        prompt tokens if with_prompt (the governor's measure)."""
        self.governor.observe_outputs(num_tokens, with_prompt)

    def _adaptive_length(self, request: Request, limit: int) -> int:
        """The request's draft length in this step: 0 while the governor has speculation off,
        else the positions its acceptance makes worth verifying (limit when not adaptive)."""
        if not self.config.adaptive:
            return limit
        if not self.speculating:
            return 0
        estimate = self.acceptance.get(request.request_id)
        if estimate is None:
            estimate = self.acceptance[request.request_id] = AcceptanceEstimate()
        length = draft_length(estimate.rate, limit, self.min_position_chance)
        if length == 0:
            estimate.decay()  # back towards the prior: the request is tried again later
        return length

    def may_draft(self, request: Request) -> bool:
        """Whether the request gets drafts in this step (from what is known without its
        tokens): when not, it runs as a plain decode, overlapped."""
        return self._adaptive_length(request, self.config.num_speculative_tokens) > 0

    def propose(self, request: Request, max_num_tokens: int) -> list[int]:
        """Drafts for one decode, no more than max_num_tokens nor the adaptive length."""
        limit = self._adaptive_length(
            request, min(max_num_tokens, self.config.num_speculative_tokens)
        )
        if limit <= 0:
            return []
        started = time.perf_counter()
        drafts = self.proposer.propose_from(request.request_id, request.all_token_ids, limit)
        self.stats.drafting_seconds += time.perf_counter() - started
        if self.config.synthetic_acceptance is not None and len(drafts) < limit:
            # Benchmarks on random weights: prompts of random ids have nothing to look up, and
            # the verifier accepts by coin anyway, so any tokens will do (the last one, again).
            drafts = drafts + [request.all_token_ids[-1]] * (limit - len(drafts))
        return drafts[:limit]

    def device_draft_length(self, request: Request, max_num_tokens: int) -> int:
        """How many drafts the worker makes on the device for the request in this step (the
        adaptive length within max_num_tokens; core/drafts_in_flight.py)."""
        return self._adaptive_length(
            request, min(max_num_tokens, self.config.num_speculative_tokens)
        )

    @property
    def drafts_in_worker(self) -> bool:
        """Whether a network in the worker drafts (its drafts come back with each step)."""
        return self._drafts_in_worker

    def num_lookahead_tokens(self, request: Request) -> int:
        """How many tokens the worker's network should draft for the request after the step
        being scheduled (the scheduler reserves as many KV slots): the adaptive length at the
        request's acceptance (k when not adaptive), 0 when its drafts would not be used."""
        if not self.drafts_in_worker or not self.proposer.wants_model_drafts(request.request_id):
            return 0
        return self._adaptive_length(request, self.config.num_speculative_tokens)

    def store_model_drafts(self, request: Request, draft_token_ids: list[int]) -> None:
        """The worker drafted these tokens to follow the request's current tokens."""
        if self.drafts_in_worker:
            self.proposer.store(request.request_id, request.num_tokens, draft_token_ids)

    def add_drafting_seconds(self, seconds: float) -> None:
        """Time the worker's draft network took (counted with the host proposers')."""
        self.stats.drafting_seconds += seconds

    def observe(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """A step verified num_drafted drafts of the request and accepted the first num_accepted."""
        if num_drafted <= 0:
            return
        observe = getattr(self.proposer, "observe", None)
        if observe is not None:
            observe(request_id, num_drafted, num_accepted)
        stats = self.stats
        stats.num_drafts += 1
        stats.num_draft_tokens += num_drafted
        stats.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            stats.num_accepted_tokens_per_pos[position] += 1
        stats.acceptance_length_counts[num_accepted] += 1
        estimate = self.acceptance.get(request_id)
        if estimate is not None:
            estimate.observe(num_drafted, num_accepted)

    def forget_history(self) -> None:
        """Drop what was learned from ended requests (the suffix table): a benchmark that
        repeats the same requests run after run must not draft from its own earlier answers."""
        forget = getattr(self.proposer, "forget_history", None)
        if forget is not None:
            forget()

    def begin_warm_up(self) -> None:
        """The start-up warm-up's steps follow: what the governor measures in them is no
        user's load, so it reports and traces nothing until forget_warm_up."""
        self.governor.report = self.governor.trace = None

    def forget_warm_up(self) -> None:
        """Start serving as if the start-up warm-up's drafted requests had never run: fresh load
        measurements, acceptance estimates and metrics, an empty suffix table."""
        self.governor = SpeculationGovernor(self.report, self.trace)
        self.acceptance.clear()
        self.stats = SpecDecodeStats.empty(self.config.num_speculative_tokens)
        self.speculating = True
        self.forget_history()

    def release(self, request: Request) -> None:
        self.acceptance.pop(request.request_id, None)
        self.proposer.release(request.request_id, request.output_token_ids)
