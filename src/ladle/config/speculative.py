"""SpeculativeConfig: speculative decoding's options (vLLM's --speculative-config keys)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ladle.spec_decode.vllm_spec_keys import from_vllm_spellings

SPECULATIVE_METHODS = ("ngram", "suffix", "draft_model", "eagle", "eagle3", "auto")
# Methods whose drafts a network computes in the worker (`model` names it); auto uses one when
# `model` is given.
MODEL_DRAFT_METHODS = ("draft_model", "eagle", "eagle3")
# vLLM's other methods: named so their users get "not yet supported", not "unknown".
SPECULATIVE_METHODS_LATER = ("mtp", "medusa")
MAX_SPECULATIVE_TOKENS = 16
# `model` for an EAGLE-3 head of random weights in the target's shape (benchmarks on dummy
# weights only: --load-format dummy).
RANDOM_DRAFT_HEAD = "random"


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (vLLM's --speculative-config keys): a proposer drafts up to
    num_speculative_tokens tokens per request per step, and the step verifies them.

    method: ngram (prompt lookup), suffix (suffix matching over the request and earlier
    outputs), draft_model (a smaller model of the same tokenizer, `model`), eagle / eagle3 (an
    EAGLE-1 / EAGLE-3 head in vLLM's checkpoint layout, `model`), or auto (per request, suffix
    drafts or the `model`'s, whichever measures better; suffix alone without `model`).
    prompt_lookup_min/max: the n-gram lengths ngram matches (and the shortest match suffix
    trusts). suffix_max_cached_requests: earlier requests' outputs the suffix index keeps.
    model: the draft model or head (folder, preset name with --load-format dummy; for eagle3
    also "random": a random head of the target's shape, dummy weights only). adaptive: choose
    each request's draft length per step from its measured acceptance and the step's cost
    (spec_decode/adaptive.py); off: always the longest draft the proposer has.
    synthetic_acceptance (benchmarks only): the verifier accepts each draft with this
    probability instead of checking it, so outputs are NOT the model's.
    drafts_on_device: with ngram and overlapped scheduling, make the drafts on the device so a
    drafted request's next step is planned while its verify step runs (engine/overlap.py).
    None (the default): on a GPU, where it measured faster (8B shape, batch 1: 1.58 against
    1.70 ms/token with host drafts), off on the CPU, where its small ops cost more host time
    than the overlap gains; false: host drafts, and drafted requests' steps are synchronous.
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    suffix_max_cached_requests: int = 1000
    model: str | None = None
    adaptive: bool = True
    synthetic_acceptance: float | None = None
    drafts_on_device: bool | None = None

    def __post_init__(self) -> None:
        if self.method in SPECULATIVE_METHODS_LATER:
            raise ValueError(
                f"speculative_config.method={self.method!r} is not yet supported by ladle; "
                f"supported: {', '.join(SPECULATIVE_METHODS)}"
            )
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(
                f"speculative_config.method must be one of {', '.join(SPECULATIVE_METHODS)}, "
                f"got {self.method!r}"
            )
        k = self.num_speculative_tokens
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"speculative_config.num_speculative_tokens must be an integer in "
                f"1..{MAX_SPECULATIVE_TOKENS}, got {k!r}"
            )
        for name in ("prompt_lookup_min", "prompt_lookup_max", "suffix_max_cached_requests"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"speculative_config.{name} must be an integer >= 1, got {value!r}"
                )
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative_config.prompt_lookup_min ({self.prompt_lookup_min}) is above "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        self._check_model()
        # drafts_on_device may also be None: the device's own default (spec_decode/placement.py).
        choices = (("adaptive", self.adaptive), ("drafts_on_device", self.drafts_on_device))
        for name, value in choices:
            if not isinstance(value, bool) and not (name == "drafts_on_device" and value is None):
                raise ValueError(f"speculative_config.{name} must be true or false, got {value!r}")
        rate = self.synthetic_acceptance
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1
        ):
            raise ValueError(
                f"speculative_config.synthetic_acceptance must be a number in [0, 1], got {rate!r}"
            )

    def _check_model(self) -> None:
        model = self.model
        if model is not None and (not isinstance(model, str) or not model.strip()):
            raise ValueError(
                f"speculative_config.model must be a path or preset name, got {model!r}"
            )
        if self.method in MODEL_DRAFT_METHODS and model is None:
            raise ValueError(
                f"speculative_config.model is required for method {self.method!r} (the draft "
                "model's or head's folder)"
            )
        if self.method in ("ngram", "suffix") and model is not None:
            raise ValueError(
                f"speculative_config.model is not used by method {self.method!r} (model-free "
                "drafts); use draft_model, eagle, eagle3 or auto"
            )
        if model == RANDOM_DRAFT_HEAD and self.method not in ("eagle3", "auto"):
            raise ValueError(
                f"speculative_config.model={RANDOM_DRAFT_HEAD!r} (a random EAGLE-3 head) needs "
                f"method eagle3 or auto, got {self.method!r}"
            )

    @property
    def uses_model_drafts(self) -> bool:
        """Whether a network drafts in the worker (its drafts come back with each step)."""
        return self.method in MODEL_DRAFT_METHODS or (
            self.method == "auto" and self.model is not None
        )

    @classmethod
    def from_dict(cls, options: dict) -> SpeculativeConfig:
        """Build from the user's dict (JSON), naming any key ladle does not know; vLLM's
        spellings (no `method`, `draft_tensor_parallel_size`) first become ladle's."""
        if not isinstance(options, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {options!r}")
        options = from_vllm_spellings(options)
        method = options.get("method")
        if method in SPECULATIVE_METHODS_LATER:
            # Before the keys: such a config carries keys ladle does not know yet, and the
            # method is what the user needs to hear about.
            raise ValueError(
                f"speculative_config.method={method!r} is not yet supported by ladle; "
                f"supported: {', '.join(SPECULATIVE_METHODS)}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(
                f"speculative_config: unknown key(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(known))}"
            )
        if "method" not in options:
            raise ValueError(
                f"speculative_config.method is required ({', '.join(SPECULATIVE_METHODS)})"
            )
        return cls(**options)
