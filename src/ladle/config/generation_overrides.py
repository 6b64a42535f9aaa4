"""vLLM's --override-generation-config: sampling defaults laid over the model's generation config.

The keys are generation_config.json's names, as in vLLM: temperature, top_p, top_k, min_p,
repetition_penalty, and max_new_tokens (the default max_tokens of requests, and in vLLM's
reading a ceiling on every request's max_tokens). They apply whatever --generation-config says
(with `vllm` they are the only model defaults). Checked when the config is built, so a typo is
a start-up error naming the flag rather than a default silently not applied.

    sampling_overrides({"temperature": 0.5, "max_new_tokens": 100})
    # {"temperature": 0.5, "max_tokens": 100}
"""

from __future__ import annotations

from typing import Any

FLAG = "--override-generation-config"
# generation_config.json key -> SamplingParams field
OVERRIDE_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
_INTEGER_KEYS = frozenset({"top_k", "max_new_tokens"})


def sampling_overrides(overrides: dict[str, Any] | None) -> dict[str, Any]:
    """The overrides as SamplingParams fields; ValueError naming the flag and the key when one
    is unknown or not a number of the right kind (null: the key is left to the model)."""
    if overrides is None:
        return {}
    if not isinstance(overrides, dict):
        raise ValueError(
            f"{FLAG} (override_generation_config) takes a JSON object, got {overrides!r}"
        )
    result: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in OVERRIDE_KEYS:
            raise ValueError(
                f"{FLAG} (override_generation_config): unknown key {key!r}; the keys are "
                f"{', '.join(OVERRIDE_KEYS)}"
            )
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            key in _INTEGER_KEYS and not float(value).is_integer()
        ):
            kind = "an integer" if key in _INTEGER_KEYS else "a number"
            raise ValueError(
                f"{FLAG} (override_generation_config): {key} must be {kind}, got {value!r}"
            )
        if key == "max_new_tokens" and value < 1:
            raise ValueError(
                f"{FLAG} (override_generation_config): max_new_tokens must be >= 1, got {value}"
            )
        result[OVERRIDE_KEYS[key]] = int(value) if key in _INTEGER_KEYS else float(value)
    _check_ranges(result)
    return result


def _check_ranges(fields: dict[str, Any]) -> None:
    """The ranges every request's values must meet (SamplingParams' own check)."""
    from ladle.sampling.params import SamplingParams

    try:
        SamplingParams(**fields)
    except ValueError as error:
        raise ValueError(f"{FLAG} (override_generation_config): {error}") from None
