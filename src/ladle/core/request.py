"""Request: one sequence inside the engine core.

The scheduler's one rule lives on num_computed_tokens: it catches up with num_tokens (prompt plus
outputs so far). A prefill chunk, a prefix-cache hit and a decode step all just move it forward.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from ladle.core.remote_prefill import RemotePrefill
from ladle.protocol.step import NewRequest
from ladle.sampling.params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    # Its prefix is being copied from the host tier into the device pool (a load): it holds
    # blocks but no place in the batch; when the copy is done it waits again, now a device hit.
    WAITING_FOR_KV = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # Everything after this point is finished.
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_REJECTED = enum.auto()
    # A producer's request that handed its KV to a consumer after its first token.
    FINISHED_REMOTE_DECODE = enum.auto()

    @property
    def is_finished(self) -> bool:
        return self > RequestStatus.PREEMPTED

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


# Asked for every request's output every step: one table, not a dict built per call.
_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH_CAPPED: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_REJECTED: "error",
    RequestStatus.FINISHED_REMOTE_DECODE: "remote_decode",
}


@dataclass
class RequestTimings:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    priority: int = 0
    arrival_time: float = field(default_factory=time.monotonic)
    # Folded into block hashes, so requests that differ in something beyond their token ids
    # (a LoRA, a multimodal input) never share blocks. None for plain text.
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed_tokens = 0
        # Tokens sampled by scheduled steps whose results the host has not read yet (overlapped
        # scheduling): counted as known when scheduling, absent from all_token_ids until read.
        self.num_pending_tokens = 0
        # Draft tokens its step in flight verifies: until it is read, how many tokens the
        # request has (and so where its next step starts) is unknown.
        self.num_unverified_drafts = 0
        self.num_cached_tokens = -1  # prefix-cache hit on first schedule; -1 until then
        self.num_preemptions = 0
        # Whether its next lookup may load from the host tier: off after a preemption that
        # chose recompute, a failed load, or a load just done (its blocks are device hits now;
        # looking again after an eviction would only repeat the copy).
        self.may_load_from_host = True
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        # Chained hashes of this request's full blocks, filled in by the KV cache manager.
        self.block_hashes: list[int] = []
        self.timings = RequestTimings(arrival_time=self.arrival_time)
        # The sampler's random stream: a fixed per-request seed makes a seeded request's samples
        # independent of whatever else is in the batch.
        self.sampling_seed: int = 0
        # Disaggregation (core/kv_handoff.py): a producer's request ends after its first token
        # and holds its KV for a consumer; a consumer's request pulls its prompt's KV first.
        self.remote_decode = False
        self.remote_prefill: RemotePrefill | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def max_tokens(self) -> int:
        return self.sampling_params.max_tokens  # resolved to an int by the engine on arrival

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def samples_from_host_tokens(self) -> bool:
        """Whether sampling its next token needs its latest token on the host: a grammar's mask
        follows every accepted token, a bad_words ban the output's last tokens."""
        params = self.sampling_params
        return params.structured_outputs is not None or bool(params.bad_words_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def as_new_request(self) -> NewRequest:
        """What the workers keep of this request, sent when it first runs or resumes."""
        return NewRequest(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_token_ids,
            sampling_params=self.sampling_params,
            sampling_seed=self.sampling_seed,
            eos_token_ids=list(self.eos_token_ids),
            output_token_ids=list(self.output_token_ids),
        )
