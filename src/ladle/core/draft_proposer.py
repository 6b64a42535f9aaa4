"""What the scheduler asks of a speculative-decoding proposer: draft tokens for one request.

A proposer reads the request's known tokens (all on the host: the scheduler asks only for
requests with no step in flight) and returns up to max_num_tokens ids it expects the model to
produce next. The workers verify them in the same step as the request's next token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ladle.core.request import Request


class DraftProposer(Protocol):
    def propose(self, request: Request, max_num_tokens: int) -> Sequence[int]:
        """Up to max_num_tokens draft ids that follow request.all_token_ids ([]: none)."""
        ...


@runtime_checkable
class AdaptiveDraftProposer(DraftProposer, Protocol):
    """A proposer that also learns from what the steps verified (spec_decode/speculator.py)."""

    def begin_step(self, num_decodes: int, prefill_backlog: bool = False) -> bool:
        """A step is being scheduled with this many running requests; prefill_backlog: more
        prompt tokens wait than one step computes. Returns whether any request may get drafts
        in it (False: every may_draft says no, and the scheduler skips asking)."""
        ...

    def may_draft(self, request: Request) -> bool:
        """Whether the request would get drafts in the step being scheduled (from what is
        known without its tokens): when not, it runs as a plain decode, overlapped."""
        ...

    def observe(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """A step verified num_drafted drafts of the request and accepted num_accepted."""
        ...

    def release(self, request: Request) -> None:
        """The request ended (finished, aborted): forget it, learn from its output."""
        ...


@runtime_checkable
class WorkerDraftProposer(AdaptiveDraftProposer, Protocol):
    """A proposer whose drafts a network computes in the worker after each step (a draft
    model, an EAGLE head): the scheduler reserves lookahead KV slots for them, and the step's
    result brings them back."""

    @property
    def drafts_in_worker(self) -> bool:
        """Whether drafts do come from the worker (False: the proposer is model-free)."""
        ...

    def num_lookahead_tokens(self, request: Request) -> int:
        """Tokens the worker should draft for the request after the step being scheduled."""
        ...

    def store_model_drafts(self, request: Request, draft_token_ids: list[int]) -> None:
        """The worker's drafts that follow the request's current tokens."""
        ...


# isinstance against a runtime-checkable Protocol walks the protocol's members every call
# (~70 us on Python 3.11): the scheduler asks per request per step, which made it 4 ms of a
# 128-request decode step. The answer depends on the class alone (the members are methods and
# properties), so it is kept per (class, protocol).
_IMPLEMENTS: dict[tuple[type, type], bool] = {}


def implements(proposer: object, protocol: type) -> bool:
    """isinstance(proposer, protocol) for the runtime-checkable protocols above, cached per
    class; False for None."""
    if proposer is None:
        return False
    key = (type(proposer), protocol)
    known = _IMPLEMENTS.get(key)
    if known is None:
        known = _IMPLEMENTS[key] = isinstance(proposer, protocol)
    return known


def propose_drafts(
    proposer: DraftProposer | None, request: Request, token_budget: int, max_model_len: int
) -> list[int]:
    """Draft tokens to verify beside a decode's next token: only for a request whose tokens
    are all on the host (the proposer reads them), within the budget, the model length and
    what max_tokens leaves (the token sampled after the drafts counts too)."""
    if proposer is None or request.num_pending_tokens:
        return []
    room = min(
        token_budget - 1,
        max_model_len - request.num_tokens,
        request.max_tokens - request.num_output_tokens - 1,
    )
    if room <= 0:
        return []
    return list(proposer.propose(request, room))[:room]


def num_lookahead_tokens(
    proposer: DraftProposer | None,
    request: Request,
    num_new_tokens: int,
    num_drafts: int,
    max_model_len: int,
    num_hit_tokens: int = 0,
) -> int:
    """KV slots to reserve past a grant for the worker's model drafts: only for a step that
    samples (it reaches the request's last known token), within the model length."""
    if not implements(proposer, WorkerDraftProposer) or not proposer.drafts_in_worker:
        return 0
    computed = request.num_computed_tokens + num_hit_tokens
    if computed + num_new_tokens < request.num_tokens + request.num_pending_tokens:
        return 0  # a prompt chunk short of the prompt's end samples nothing
    room = max_model_len - (computed + num_new_tokens + num_drafts)
    return max(0, min(proposer.num_lookahead_tokens(request), room))
