"""The step contract between the engine core and the workers: StepPlan in, StepResult out.

Plain data only (msgspec Structs of ints, strings, lists and SamplingParams), so a plan crosses a
process boundary as it is: the multi-process executor encodes it once and every rank decodes the
same plan. Nothing here refers to a live scheduler object; a worker keeps what it needs of each
request itself (worker/request_states.py), filled from the plan.

A request is sent in full once, the first time it is scheduled (NewRequest), and again in full
when it resumes after a preemption (the worker forgot it then). Every later step sends only what
changed (ScheduledRequest): the tokens granted this step, where they start, the blocks its table
gained, and any draft tokens to verify.

A StepResult holds, per scheduled request, a list of accepted token ids: empty for a prompt chunk
short of the prompt's end, one for a plain decode, and up to k + 1 when k draft tokens were
verified (the accepted drafts, then the token sampled after the last of them). With a draft
network in the worker (draft model, EAGLE head) it also carries the drafts for the next step.
"""

from __future__ import annotations

import msgspec

from ladle.protocol.messages import TokenLogprobs
from ladle.sampling.params import SamplingParams


class BlockUpdate(msgspec.Struct, array_like=True, gc=False):
    """Blocks a request's table gained: they start at index `start` of its table."""

    start: int
    block_ids: list[int]


class NewRequest(msgspec.Struct, array_like=True, gc=False):
    """Everything a worker keeps about a request, sent when it first runs (or resumes)."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    sampling_seed: int  # the request's random stream (drawn by the engine if it brought none)
    eos_token_ids: list[int]
    # Tokens generated before a preemption: a resumed request recomputes them as prompt.
    output_token_ids: list[int] = []


class ScheduledRequest(msgspec.Struct, array_like=True, gc=False):
    """One request's share of a step, in batch order."""

    request_id: str
    num_tokens: int  # tokens computed this step (draft tokens included)
    num_computed_before: int  # where they start: the request's computed count before the step
    # The index among its outputs of the first token this step samples (its random stream's
    # counter); -1 when the step does not reach the end of its known tokens (a prompt chunk).
    output_index: int = -1
    new_blocks: BlockUpdate | None = None  # None: its table is unchanged
    # Proposed tokens to verify: they follow its last known token, and num_tokens counts them.
    draft_token_ids: list[int] = []
    # Model drafts (a draft model or EAGLE head in the worker): after this step the worker
    # drafts this many tokens past the request's accepted ones, writing the draft network's KV
    # into as many slots reserved beyond the step's tokens (0: it drafts nothing for it).
    num_lookahead_tokens: int = 0
    # Drafts the request's step before this one verifies, still unread when this step was
    # planned (engine/overlap.py): num_computed_before and output_index assume all of them are
    # accepted, and the worker moves this step back on the device by as many as that step
    # rejected. Draft ids of -1 are drafted on the device (device n-gram), not by the host.
    num_unverified_before: int = 0

    @property
    def samples(self) -> bool:
        return self.output_index >= 0


# KVOperation kinds: device pool -> host tier (a write-back), host tier -> device pool (a load),
# and another engine instance's pool -> this device pool (a pull: prefill/decode disaggregation).
KV_STORE = "store"
KV_LOAD = "load"
KV_PULL = "pull"


class KVOperation(msgspec.Struct, array_like=True, gc=False):
    """A copy of KV blocks between the device pool and the host tier (core/host_tier.py), or
    from a producer instance's pool into this one (a pull, core/kv_handoff.py).

    source_block_ids[i] is copied to target_block_ids[i] in every layer (K and V): for a store
    the sources are device block ids and the targets host block ids, for a load the reverse.
    op_id names the operation in StepResult.kv_operations_done / kv_operations_failed.

    Ordering, which the scheduler relies on: a worker issues a step's operations before that
    step's forward pass, after every earlier step's forward (so a store reads finished KV),
    and the next step's forward waits for them (so a load is in place, and a device block freed
    meanwhile is not rewritten under a copy). Operations run in plan order on one stream."""

    kind: str
    source_block_ids: list[int]
    target_block_ids: list[int]
    op_id: int = 0
    # For a pull: the producer instance's exported pool (worker/kv_peers.py descriptor);
    # its source ids are the producer's block ids.
    peer: str = ""
    before_forward: bool = False


class StepPlan(msgspec.Struct, gc=False):
    """What the scheduler decided for one step."""

    scheduled: list[ScheduledRequest] = []
    new_requests: list[NewRequest] = []  # the scheduled requests the workers do not know yet
    # Requests the workers may forget before this step runs: ended or preempted since the last.
    finished_request_ids: list[str] = []
    preempted_request_ids: list[str] = []
    kv_operations: list[KVOperation] = []
    num_prefill_tokens: int = 0  # prompt chunks and recomputes
    num_decode_tokens: int = 0  # one token each for requests that have sampled before
    # Some sampling row reads its request's latest tokens on the host (a grammar's mask,
    # bad_words): with a step in flight, this one is sampled only once that step is read.
    samples_from_host_tokens: bool = False

    @property
    def num_requests(self) -> int:
        return len(self.scheduled)

    def request_ids(self) -> list[str]:
        return [scheduled.request_id for scheduled in self.scheduled]

    def sampling_rows(self) -> list[tuple[int, int]]:
        """The step's sampling rows, in the order the workers sample them: (position of the
        request in scheduled, how many of its drafts precede the row). A request that samples
        has one row, plus one per draft token it verifies."""
        return [
            (position, offset)
            for position, scheduled in enumerate(self.scheduled)
            if scheduled.samples
            for offset in range(1 + len(scheduled.draft_token_ids))
        ]

    def without(self, request_ids: set[str]) -> StepPlan:
        """The same step minus some requests (fault isolation); the workers forget them."""
        return msgspec.structs.replace(
            self,
            scheduled=[s for s in self.scheduled if s.request_id not in request_ids],
            new_requests=[r for r in self.new_requests if r.request_id not in request_ids],
            finished_request_ids=self.finished_request_ids + sorted(request_ids),
        )

    def only(self, request_id: str) -> StepPlan:
        """This step for one request alone, nothing forgotten (a fault-isolation probe)."""
        return msgspec.structs.replace(
            self,
            scheduled=[s for s in self.scheduled if s.request_id == request_id],
            new_requests=[r for r in self.new_requests if r.request_id == request_id],
            finished_request_ids=[],
            preempted_request_ids=[],
            kv_operations=[],  # the probed step copies nothing: the full run did or will
        )


class GrammarMasks(msgspec.Struct, array_like=True, gc=False):
    """A step's allowed-token masks for its grammar rows, as plain host data.

    bitmask: the packed int32 words, row after row ([len(rows), words]);
    rows: the sampling rows (in the order the step samples them) that the masks apply to."""

    bitmask: bytes
    words: int
    rows: list[int]


class PromptLogprobsChunk(msgspec.Struct, array_like=True, gc=False):
    """The logprobs of prompt tokens first_position .. first_position + len(entries) - 1."""

    prompt_len: int
    first_position: int
    entries: list[TokenLogprobs]


class KVTransferStats(msgspec.Struct, array_like=True, gc=False):
    """Bytes the host tier's copies moved and the device time they took (seconds; for copies
    whose end the worker has seen complete): all copies, and of those the loads; and the
    pulls of a disaggregated consumer."""

    bytes_to_host: int = 0
    bytes_to_device: int = 0
    copy_seconds: float = 0.0
    load_seconds: float = 0.0
    # Pulls from producer instances (worker/kv_peers.py): how many, their bytes and the time
    # they took (host wall time around each pull; on CUDA the copies are queued, not waited).
    num_pulls: int = 0
    bytes_pulled: int = 0
    pull_seconds: float = 0.0


class StepResult(msgspec.Struct, gc=False):
    """What the device produced for one step, per scheduled request in plan order."""

    request_ids: list[str]
    # Accepted token ids: [] for a prompt chunk that did not sample, else 1 .. k + 1 ids.
    token_ids: list[list[int]]
    # Per request, one entry per accepted token; None when the request asked for none.
    logprobs: list[list[TokenLogprobs] | None] | None = None
    # request id -> this step's prompt logprobs, for requests that asked.
    prompt_logprobs: dict[str, PromptLogprobsChunk] | None = None
    # The plan's KV operations that were issued (in order behind this step: see KVOperation)
    # and those that failed (op_id -> why): a failed copy frees its blocks on both sides.
    kv_operations_done: list[int] = []
    kv_operations_failed: dict[int, str] = {}
    # Copies the worker measured since its last result (bytes each way, device time).
    kv_transfer: KVTransferStats | None = None
    # request id -> why the step failed on that request alone (it was left out of the step).
    failed: dict[str, str] = {}
    # Model drafts: request id -> the draft tokens that follow the tokens this step accepted
    # (the next step verifies them), and the time the draft network took (seconds).
    draft_token_ids: dict[str, list[int]] = {}
    drafting_seconds: float = 0.0
