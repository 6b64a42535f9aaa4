"""SamplingParams: how one request's tokens are chosen and when it stops.

Validated on construction: a bad value raises ValueError naming the field, so neither the
offline API nor the server ever hands the engine a request it cannot run.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from ladle.sampling.extras import validate_sampling_extras
from ladle.sampling.limits import LIMITS
from ladle.structured.params import StructuredOutputsParams

# Greedy below this temperature: dividing logits by ~0 would only produce infs.
GREEDY_TEMPERATURE = 1e-5
MAX_LOGPROBS = LIMITS["logprobs"].high
MAX_STOP_STRINGS = 256
# Characters over all stop strings: bounds the per-request tables the stop checker builds.
MAX_STOP_CHARACTERS = 65536
MAX_N = LIMITS["n"].high
# The fields whose ranges LIMITS states (stop_token_ids, element-wise, is checked apart).
NUMERIC_FIELDS = (
    "n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "seed", "max_tokens", "min_tokens", "logprobs",
)
OPTIONAL_FIELDS = frozenset({"seed", "max_tokens", "logprobs"})  # None: not given


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
    # JSON schema / regex / choice / grammar the output must follow (a dict of the same fields
    # is accepted too); see ladle.structured.
    structured_outputs: StructuredOutputsParams | None = None
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
    guided_decoding: Any = None
    # Folded into the request's prefix-cache block hashes: requests with different salts never
    # share cached KV (vLLM takes it with the prompt; the server's cache_salt field sets it).
    cache_salt: str | None = None
    # bad_words as token sequences: set from the tokenizer when the request arrives
    # (sample/bad_words.py); given directly, it works without one.
    bad_words_token_ids: list[list[int]] | None = None

    def __post_init__(self) -> None:
        if self.seed == -1:  # vLLM's spelling of "no seed"
            self.seed = None
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        self._validate()

    def _validate(self) -> None:
        def require(condition: bool, message: str) -> None:
            if not condition:
                raise ValueError(message)

        # Every numeric range comes from the one table the server's request models use too.
        for name in NUMERIC_FIELDS:
            value = getattr(self, name)
            if value is not None or name not in OPTIONAL_FIELDS:
                LIMITS[name].check(value)
        for token_id in self.stop_token_ids:
            LIMITS["stop_token_ids"].check(token_id)
        require(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
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
        validate_sampling_extras(self)
        require(
            self.structured_outputs is None
            or isinstance(self.structured_outputs, StructuredOutputsParams),
            "structured_outputs must be a StructuredOutputsParams or a dict of its fields",
        )

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

    def clone(self) -> SamplingParams:
        """A deep copy (vLLM's SamplingParams.clone()): editing it leaves this one as it is."""
        return copy.deepcopy(self)

    def with_seed(self, seed: int | None) -> SamplingParams:
        """A copy for one of the n samples (n=1 there), each with a seed of its own."""
        copy = SamplingParams(**{**self.__dict__, "n": 1, "seed": seed})
        return copy
