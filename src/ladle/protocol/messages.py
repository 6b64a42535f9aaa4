"""The messages between the front end (offline LLM or the API process) and the engine core.

Plain dataclasses of plain values, so they cross a process boundary as they are (the server
encodes them with msgspec) and the engine core never needs the server stack. The two that the
engine makes per request and step, EngineCoreOutput and TokenLogprobs, are msgspec Structs
instead: encoded as arrays (no field names: a 256-stream step's frame 67 -> 18 kB), built and
decoded in C, and not tracked by the garbage collector (they hold no references back). Measured
on a 256-output frame: build 249 -> 86 us, encode 143 -> 34 us (engine process), decode 400 ->
84 us (API process).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import msgspec

from ladle.sampling.params import SamplingParams


class RequestRejectedError(ValueError):
    """A request that can never run (too long for the model or the KV pool). Raised at once, so
    it is never queued and retried forever."""


@dataclass
class EngineCoreRequest:
    """One sequence to generate. n > 1 is fanned out into n of these by the front end."""

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = 0.0
    priority: int = 0
    # Prefill/decode disaggregation (vLLM's name): {"do_remote_decode": true} on a producer
    # (compute the prompt and first token, hold the KV); on a consumer the handoff a producer
    # returned, plus "first_token_ids" (core/kv_handoff.py).
    kv_transfer_params: dict | None = None


class TokenLogprobs(msgspec.Struct, array_like=True, gc=False):
    """Logprobs of one generated token: its own, its rank, and the top candidates.

    Logprobs are those of the model's raw distribution (log_softmax of the logits before
    temperature, penalties and truncation), as vLLM and OpenAI report them.
    """

    token_id: int
    logprob: float
    rank: int
    top_token_ids: list[int] = []  # msgspec gives each instance its own empty list
    top_logprobs: list[float] = []


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """What one step produced for one request."""

    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None  # 'stop' | 'length' | 'abort' | 'error' | None (running)
    stop_reason: int | None = None  # the stop token id that ended it, if one did
    num_cached_tokens: int = 0
    # Monotonic times (seconds) the front end turns into queue time, TTFT and decode time.
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    error: str | None = None  # why, when finish_reason is 'error'
    # With the first output of a request that asked for prompt_logprobs: one entry per prompt
    # token, None for the first (engine/prompt_logprobs.py).
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    # A producer's handoff (finish_reason 'remote_decode'): where a consumer pulls the KV from.
    kv_transfer_params: dict | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


# Upper bounds (s) of the engine's step-time histogram (/metrics): a running stream's inter-token
# time is at least its step's time, so the slow steps are where a server's ITL tail comes from.
STEP_TIME_BOUNDS_S = (0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32)


@dataclass
class SpecDecodeStats:
    """Speculative decoding's counters since start (spec_decode/speculator.py): vLLM's
    spec_decode metrics, the acceptance-length histogram and the host time spent drafting."""

    num_drafts: int = 0  # requests' steps that verified at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # [k]: how often the draft at each position was accepted.
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    # [k + 1]: drafted steps by number of drafts accepted (0..k); the acceptance length is that
    # plus the one token every step samples.
    acceptance_length_counts: list[int] = field(default_factory=list)
    drafting_seconds: float = 0.0

    @classmethod
    def empty(cls, num_speculative_tokens: int) -> SpecDecodeStats:
        return cls(
            num_accepted_tokens_per_pos=[0] * num_speculative_tokens,
            acceptance_length_counts=[0] * (num_speculative_tokens + 1),
        )

    def snapshot(self) -> SpecDecodeStats:
        """A copy that later counting leaves alone (its lists copied): the engine sends one with
        every step's stats, where copy.deepcopy cost ~20 us a step."""
        return dataclasses.replace(
            self,
            num_accepted_tokens_per_pos=list(self.num_accepted_tokens_per_pos),
            acceptance_length_counts=list(self.acceptance_length_counts),
        )

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per drafted request step: 1 + accepted drafts per drafted step (0: none)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


@dataclass
class SchedulerStats:
    """A snapshot for metrics and for tests that check the pool drains."""

    num_running_reqs: int = 0
    num_waiting_reqs: int = 0
    kv_cache_usage: float = 0.0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    prefix_cache_queries: int = 0  # tokens looked up
    prefix_cache_hits: int = 0  # tokens found
    num_preemptions: int = 0
    # Measured by the engine core's StepMeter (engine/step_meter.py).
    prefill_tokens_per_s: float = 0.0  # moving average over steps that computed prompt tokens
    mean_step_time_s: float = 0.0
    num_prefill_tokens: int = 0  # prompt tokens computed since start (recomputes included)
    num_decode_tokens: int = 0
    # StepMeter's step-time histogram: counts per STEP_TIME_BOUNDS_S bucket and total seconds.
    prefill_step_counts: tuple[int, ...] = ()
    decode_step_counts: tuple[int, ...] = ()
    prefill_step_seconds: float = 0.0
    decode_step_seconds: float = 0.0
    num_graph_steps: int = 0  # model runs replayed from a CUDA graph
    num_eager_steps: int = 0  # model runs launched eagerly
    # Mixtures of experts: (token, expert) assignments per expert since start-up, summed over
    # the MoE layers (worker/expert_load.py); () for a dense model.
    expert_token_counts: tuple[int, ...] = ()
    # The engine-side inter-token gaps (engine/token_gap_meter.py): counts per
    # ENGINE_ITL_BOUNDS_S bucket and their total seconds, filled in by the engine-core loop.
    engine_itl_counts: tuple[int, ...] = ()
    engine_itl_seconds: float = 0.0
    # The host tier of the KV cache (core/host_tier.py); zeros when it is off.
    num_swapped_preemptions: int = 0  # preemptions that resume from the host tier
    num_waiting_for_kv: int = 0  # requests whose prefix is being loaded (in num_waiting_reqs)
    host_cache_queries: int = 0  # tokens looked up on the host (after the device hits)
    host_cache_hits: int = 0  # tokens found there
    num_host_blocks: int = 0
    num_host_cached_blocks: int = 0  # host blocks holding some prefix's KV
    host_kv_usage: float = 0.0  # fraction of host blocks a copy is using now (0 when idle)
    num_host_stores_dropped: int = 0  # write-backs a full host tier refused
    # Blocks written back as they were evicted (the step reusing them waited for the copy).
    num_host_blocks_stored_at_eviction: int = 0
    kv_bytes_to_host: int = 0
    kv_bytes_to_device: int = 0
    kv_copy_seconds: float = 0.0  # device time of the host tier's copies, both ways
    kv_load_seconds: float = 0.0  # of which host -> device
    # Prefill/decode disaggregation (core/kv_handoff.py): a consumer's pulls, a producer's holds.
    num_kv_pulls: int = 0  # pulls that completed
    num_kv_pull_blocks: int = 0
    kv_pull_bytes: int = 0
    kv_pull_seconds: float = 0.0
    num_kv_pulls_failed: int = 0  # pulls that failed: the prompt was computed here instead
    num_kv_pulls_too_late: int = 0  # handoffs too close to their expiry: computed, not pulled
    num_kv_handoffs: int = 0  # prompts handed off (a producer's), since start
    num_kv_handoffs_held: int = 0  # of those, still held for a consumer now
    num_kv_handoff_blocks_held: int = 0
    num_kv_handoffs_expired: int = 0  # freed unpulled after the hold timeout
    spec_decode: SpecDecodeStats | None = None  # None: speculation is off
