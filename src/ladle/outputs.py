"""What a user gets back: RequestOutput with one CompletionOutput per sample (n of them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ladle.protocol.messages import TokenLogprobs


@dataclass
class RequestMetrics:
    """Per-request timings in seconds (monotonic clock).

    queue_time: arrival until first scheduled. ttft: arrival until the first token.
    decode_time: first token until the last. e2e_latency: arrival until finished.
    """

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def decode_time(self) -> float | None:
        if self.first_token_time is None or self.last_token_time is None:
            return None
        return self.last_token_time - self.first_token_time

    @property
    def e2e_latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time


@dataclass
class CompletionOutput:
    """One sample of a request. text / token_ids accumulate; the *_delta fields hold what the
    latest step added (for streaming)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs] | None = None
    finish_reason: str | None = None  # 'stop' | 'length' | 'abort' | 'error'
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it
    text_delta: str = ""
    token_ids_delta: list[int] = field(default_factory=list)
    logprobs_delta: list[TokenLogprobs] | None = None
    # Sum of the sampled tokens' logprobs; set by LLM when logprobs were asked for (as vLLM).
    cumulative_logprob: float | None = None

    def finished(self) -> bool:
        """Whether this sample has ended: a method, as vLLM's CompletionOutput.finished()
        (RequestOutput.finished is a field, in vLLM and here)."""
        return self.finish_reason is not None


@dataclass
class Logprob:
    """vLLM's per-candidate logprob entry: LLM returns completion logprobs as one
    {token_id: Logprob} dict per generated token (the sampled token and the top candidates)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None
    # Set when the request could not run at all (e.g. rejected as too long): its finish_reason
    # is 'error' and this says why. Other requests of the same batch are unaffected.
    error: str | None = None
    # SamplingParams.prompt_logprobs: None for the first prompt token, then one entry per token
    # (TokenLogprobs in the engine and the server; LLM returns vLLM's {token_id: Logprob}).
    prompt_logprobs: list | None = None
    # Prefill/decode disaggregation behind an external proxy (vLLM's field): a prefill
    # instance's answer says where the decode instance pulls the prompt's KV from.
    kv_transfer_params: dict | None = None
