"""SamplingParams: how one request's tokens are chosen and when it stops.

Validated on construction: a bad value raises ValueError naming the field, so neither the
offline API nor the server ever hands the engine a request it cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ladle.sampling_extras import validate_sampling_extras

# Greedy below this temperature: dividing logits by ~0 would only produce infs.
GREEDY_TEMPERATURE = 1e-5
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 256
# Characters over all stop strings: bounds the per-request tables the stop checker builds.
MAX_STOP_CHARACTERS = 65536
MAX_N = 128


@dataclass
class SamplingParams:
    """Per-request sampling and stopping options (vLLM's names and defaults where one exists)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    extra: dict = field(default_factory=dict)
    # vLLM's further fields: validated (and, where ladle lacks them, refused) in sampling_extras.
    detokenize: bool = True
    truncate_prompt_tokens: int | None = None
    spaces_between_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    prompt_logprobs: int | None = None
    logits_processors: list | None = None
    structured_outputs: Any = None
    guided_decoding: Any = None

    def __post_init__(self) -> None:
        if self.seed == -1:  # vLLM's spelling of "no seed"
            self.seed = None
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self._validate()

    def _validate(self) -> None:
        def require(condition: bool, message: str) -> None:
            if not condition:
                raise ValueError(message)

        require(
            _is_int(self.n) and 1 <= self.n <= MAX_N, f"n must be in [1, {MAX_N}], got {self.n!r}"
        )
        require(
            _is_number(self.temperature) and self.temperature >= 0.0,
            f"temperature must be >= 0, got {self.temperature!r}",
        )
        require(
            _is_number(self.top_p) and 0.0 < self.top_p <= 1.0,
            f"top_p must be in (0, 1], got {self.top_p!r}",
        )
        require(
            _is_int(self.top_k) and self.top_k >= -1,
            f"top_k must be -1 (disabled) or >= 0, got {self.top_k!r}",
        )
        require(
            _is_number(self.min_p) and 0.0 <= self.min_p <= 1.0,
            f"min_p must be in [0, 1], got {self.min_p!r}",
        )
        require(
            _is_number(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
            f"presence_penalty must be in [-2, 2], got {self.presence_penalty!r}",
        )
        require(
            _is_number(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
            f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty!r}",
        )
        require(
            _is_number(self.repetition_penalty) and 0.0 < self.repetition_penalty <= 10.0,
            f"repetition_penalty must be in (0, 10], got {self.repetition_penalty!r}",
        )
        require(
            self.seed is None or _is_int(self.seed), f"seed must be an integer, got {self.seed!r}"
        )
        require(
            self.max_tokens is None or (_is_int(self.max_tokens) and self.max_tokens >= 1),
            f"max_tokens must be >= 1, got {self.max_tokens!r}",
        )
        require(
            _is_int(self.min_tokens) and self.min_tokens >= 0,
            f"min_tokens must be >= 0, got {self.min_tokens!r}",
        )
        require(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
        )
        require(
            self.logprobs is None
            or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
            f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs!r}",
        )
        require(
            len(self.stop) <= MAX_STOP_STRINGS,
            f"stop may hold at most {MAX_STOP_STRINGS} strings, got {len(self.stop)}",
        )
        require(
            all(isinstance(s, str) and s for s in self.stop),
            "stop must be a list of non-empty strings",
        )
        num_stop_characters = sum(len(s) for s in self.stop)
        require(
            num_stop_characters <= MAX_STOP_CHARACTERS,
            f"stop strings may hold at most {MAX_STOP_CHARACTERS} characters in all, "
            f"got {num_stop_characters}",
        )
        require(
            all(_is_int(t) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids must be non-negative integers",
        )
        validate_sampling_extras(self)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def uses_penalties(self) -> bool:
        return (
            self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    def with_seed(self, seed: int | None) -> SamplingParams:
        """A copy for one of the n samples (n=1 there), each with a seed of its own."""
        copy = SamplingParams(**{**self.__dict__, "n": 1, "seed": seed})
        return copy


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
