"""vLLM's SamplingParams fields beyond ladle's core ones: accepted by name, validated here, and
either implemented (where named) or refused with a ValueError that names the field.

Implemented: seed=-1 (random, as None), detokenize=False (token ids only, no text),
truncate_prompt_tokens (keep the last k prompt tokens; -1 keeps max_model_len),
spaces_between_special_tokens=True (what the detokenizer does; False only with
skip_special_tokens, where it changes nothing), logit_bias and
allowed_token_ids and bad_words (sample/logit_processing.py), prompt_logprobs
(worker/prompt_logprobs.py). Refused while ladle lacks them, when set to anything that would
change the result: logits_processors,
guided_decoding (use structured_outputs).
"""

from __future__ import annotations

from typing import Any

from ladle.sampling.limits import LIMITS

# field -> why it is refused (only when set to a value that would have an effect).
UNSUPPORTED_SAMPLING_FIELDS = {
    "logits_processors": "logits_processors is not supported by ladle",
    "guided_decoding": "guided_decoding is vLLM's older name: use structured_outputs",
}


def validate_sampling_extras(params: Any) -> None:
    """Raise ValueError naming the first vLLM field that is invalid or that ladle cannot do."""
    for name, reason in UNSUPPORTED_SAMPLING_FIELDS.items():
        value = getattr(params, name, None)
        if value is not None and value != {} and value != [] and value is not False:
            raise ValueError(f"{name}: {reason}")
    _validate_logit_bias(params)
    allowed = params.allowed_token_ids
    if allowed is not None:
        if (
            isinstance(allowed, (str, bytes))
            or not isinstance(allowed, (list, tuple))
            or not all(_is_int(t) and t >= 0 for t in allowed)
        ):
            raise ValueError("allowed_token_ids must be a list of non-negative integers")
        if not allowed:
            raise ValueError("allowed_token_ids must not be empty (leave it None for no limit)")
        params.allowed_token_ids = list(allowed)
    truncate = params.truncate_prompt_tokens
    if truncate is not None and not (
        isinstance(truncate, int)
        and not isinstance(truncate, bool)
        and (truncate >= 1 or truncate == -1)
    ):
        raise ValueError(f"truncate_prompt_tokens must be >= 1 or -1, got {truncate!r}")
    _validate_bad_words(params)
    if params.prompt_logprobs is not None:
        # vLLM's -1 (the whole vocabulary) is beyond any --max-logprobs ladle allows.
        if not LIMITS["logprobs"].accepts(params.prompt_logprobs):
            raise ValueError(
                f"prompt_logprobs {LIMITS['logprobs'].describe()}, got {params.prompt_logprobs!r}"
            )
    salt = params.cache_salt
    if salt is not None and not (isinstance(salt, str) and salt):
        raise ValueError(f"cache_salt must be a non-empty string, got {salt!r}")
    if not isinstance(params.detokenize, bool):
        raise ValueError(f"detokenize must be a bool, got {params.detokenize!r}")
    if not params.detokenize and params.stop:
        raise ValueError("stop strings need detokenize=True (they are matched in the text)")
    if not isinstance(params.spaces_between_special_tokens, bool):
        raise ValueError(
            "spaces_between_special_tokens must be a bool, "
            f"got {params.spaces_between_special_tokens!r}"
        )
    # With skip_special_tokens (the default) no special token reaches the text, so there is
    # nothing to space: False changes nothing then, and scripts that pass it run.
    if not params.spaces_between_special_tokens and not params.skip_special_tokens:
        raise ValueError(
            "spaces_between_special_tokens=False with skip_special_tokens=False is not "
            "supported by ladle (special tokens are decoded with the tokenizer's own spacing)"
        )


def _validate_bad_words(params: Any) -> None:
    words = params.bad_words
    if words is not None:
        if isinstance(words, str) or not isinstance(words, (list, tuple)) or not all(
            isinstance(word, str) and word.strip() for word in words
        ):
            raise ValueError("bad_words must be a list of non-empty strings")
        params.bad_words = list(words)
    sequences = params.bad_words_token_ids
    if sequences is not None:
        if not isinstance(sequences, (list, tuple)) or not all(
            isinstance(seq, (list, tuple)) and seq and all(_is_int(t) and t >= 0 for t in seq)
            for seq in sequences
        ):
            raise ValueError(
                "bad_words_token_ids must be a list of non-empty lists of non-negative token ids"
            )
        params.bad_words_token_ids = [list(seq) for seq in sequences]


# OpenAI's documented range; values at the ends ban or force a token.
MAX_ABS_LOGIT_BIAS = 100.0


def _validate_logit_bias(params: Any) -> None:
    bias = params.logit_bias
    if bias is None:
        return
    if not isinstance(bias, dict):
        raise ValueError("logit_bias must map token ids to numbers")
    cleaned = {}
    for token_id, value in bias.items():
        # JSON objects have string keys: "50256" is token 50256, as OpenAI takes it.
        if isinstance(token_id, str) and token_id.strip().isdigit():
            token_id = int(token_id)
        if not _is_int(token_id) or token_id < 0:
            raise ValueError(f"logit_bias keys must be non-negative token ids, got {token_id!r}")
        if not _is_number(value) or not -MAX_ABS_LOGIT_BIAS <= value <= MAX_ABS_LOGIT_BIAS:
            raise ValueError(
                f"logit_bias values must be in [-{MAX_ABS_LOGIT_BIAS:g}, "
                f"{MAX_ABS_LOGIT_BIAS:g}], got {value!r} for token {token_id}"
            )
        cleaned[token_id] = float(value)
    params.logit_bias = cleaned


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
