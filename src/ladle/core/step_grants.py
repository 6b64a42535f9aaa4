"""The step the scheduler is deciding: the requests granted tokens, in batch order, and what
changed for each, turned into the step's plan (plain data for the workers) once scheduling is
done (core/scheduler.py decides the grants)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ladle.core.request import Request
from ladle.protocol.step import BlockUpdate, ScheduledRequest, StepPlan


@dataclass
class StepGrants:
    """The step being decided: requests granted tokens, in batch order, and what changed.

    Preemption can take back a grant made earlier in the same step, so the plan (plain data) is
    built from this only once scheduling is done."""

    requests: list[Request] = field(default_factory=list)
    num_tokens: dict[str, int] = field(default_factory=dict)
    new_blocks: dict[str, BlockUpdate] = field(default_factory=dict)
    draft_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # Model drafts: KV slots reserved past the granted tokens for the worker's drafting.
    num_lookahead_tokens: dict[str, int] = field(default_factory=dict)
    preempted_request_ids: list[str] = field(default_factory=list)

    def add(self, request: Request, num_tokens: int) -> None:
        self.requests.append(request)
        self.num_tokens[request.request_id] = num_tokens

    def take_back(self, request: Request) -> int:
        """Withdraw the request's grant (it is being preempted); returns its tokens."""
        request_id = request.request_id
        self.new_blocks.pop(request_id, None)
        self.draft_token_ids.pop(request_id, None)
        self.num_lookahead_tokens.pop(request_id, None)
        if request in self.requests:
            self.requests.remove(request)
        return self.num_tokens.pop(request_id, 0)

    def fill_plan(self, plan: StepPlan, on_workers: set[str]) -> None:
        """Add the granted requests to `plan`: each one's scheduled tokens, and in full those
        the workers do not hold yet (added to on_workers). Counts the tokens as computed now and
        the samples as pending, so the next schedule can run before this step's results are
        read."""
        for request in self.requests:
            request_id = request.request_id
            num_new = self.num_tokens[request_id]
            drafts = self.draft_token_ids.get(request_id, [])
            computed = request.num_computed_tokens
            unverified = request.num_unverified_drafts  # worst case: all accepted
            num_outputs = request.num_output_tokens + request.num_pending_tokens + unverified
            num_known = request.num_tokens + request.num_pending_tokens + unverified
            if num_outputs > 0 and computed == num_known - 1 and num_new == 1 + len(drafts):
                plan.num_decode_tokens += num_new
            else:
                plan.num_prefill_tokens += num_new
            samples = computed + num_new - len(drafts) >= num_known
            plan.scheduled.append(
                ScheduledRequest(
                    request_id=request_id,
                    num_tokens=num_new,
                    num_computed_before=computed,
                    output_index=num_outputs if samples else -1,
                    new_blocks=self.new_blocks.get(request_id),
                    draft_token_ids=drafts,
                    num_lookahead_tokens=(
                        self.num_lookahead_tokens.get(request_id, 0) if samples else 0
                    ),
                    num_unverified_before=unverified,
                )
            )
            if request_id not in on_workers:
                on_workers.add(request_id)
                plan.new_requests.append(request.as_new_request())
            if samples and request.samples_from_host_tokens:
                plan.samples_from_host_tokens = True
            request.num_computed_tokens = computed + num_new
            if samples:
                request.num_pending_tokens += 1
                request.num_unverified_drafts += len(drafts)
