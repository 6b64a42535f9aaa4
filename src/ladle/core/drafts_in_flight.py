"""Drafted requests planned while their last step is in flight (overlapped scheduling).

Without this, a request that verifies drafts is not scheduled again until its step is read: how
many drafts it accepts decides where its next step starts, and the host proposer reads its
tokens. With device drafts (the engine's `drafts_on_device`: n-gram drafting moved onto the
device, worker/device_ngram.py) the scheduler plans that next step at once, for the worst case:

- it assumes every unread draft is accepted (Request.num_unverified_drafts), so the step's
  num_computed_before and output_index are upper bounds and its KV slots are reserved for
  them; the worker moves the step back on the device by the drafts that step rejected
  (ScheduledRequest.num_unverified_before), and the scheduler gives the unused slots back once
  the step is read (its rollback of rejected drafts);
- its draft ids are placeholders (DEVICE_DRAFT): the worker drafts them from its device copy of
  the request's tokens after the unread step's tokens are known there.

A request whose sampling needs host state the worker does not have until the step is read
stays synchronous: a grammar or bad_words (host tokens), penalties (their rows are indexed by
the output count), or min_tokens not yet certainly met (its ban reads the output count).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ladle.core.draft_proposer import AdaptiveDraftProposer, DraftProposer
    from ladle.core.request import Request

# A draft id the worker fills in on the device.
DEVICE_DRAFT = -1


def may_plan_in_flight(request: Request) -> bool:
    """Whether the request's next step may be planned while its last one is unread, with
    device drafts: its sampling reads nothing that only the host learns from that step."""
    params = request.sampling_params
    return (
        not request.samples_from_host_tokens
        and not params.uses_penalties
        # Each unread step emits at least one token: the least the output count can be.
        and request.num_output_tokens + request.num_pending_tokens >= params.min_tokens
    )


def num_known_worst_case(request: Request) -> int:
    """The request's tokens if every unread step accepted all its drafts."""
    return request.num_tokens + request.num_pending_tokens + request.num_unverified_drafts


def device_drafts(
    proposer: DraftProposer, request: Request, token_budget: int, max_model_len: int
) -> list[int]:
    """Placeholders for the drafts the worker makes on the device: as many as the proposer's
    (adaptive) length allows within the budget, the model length and max_tokens, counted for
    the worst case (all unread drafts accepted)."""
    num_known = num_known_worst_case(request)
    num_outputs = num_known - request.num_prompt_tokens
    room = min(token_budget - 1, max_model_len - num_known, request.max_tokens - num_outputs - 1)
    if room <= 0:
        return []
    return [DEVICE_DRAFT] * proposer.device_draft_length(request, room)


def waits_for_its_step(
    request: Request, proposer: DraftProposer | None, adaptive: AdaptiveDraftProposer | None
) -> bool:
    """Without device drafts: whether the request is not scheduled until its step in flight is
    read. How far it got depends on how many drafts that step accepts; and a proposer reads
    every token, so a decode it will draft for waits for its step to be read (speculation makes
    that request's steps synchronous, not the engine's). One the adaptive rule would not draft
    for runs overlapped."""
    if request.num_unverified_drafts:
        return True
    return bool(
        proposer is not None
        and request.num_pending_tokens
        and request.num_computed_tokens >= request.num_tokens
        and (adaptive is None or adaptive.may_draft(request))
    )
