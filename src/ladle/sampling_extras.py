"""vLLM's SamplingParams fields beyond ladle's core ones: accepted by name, validated here, and
either implemented (where named) or refused with a ValueError that names the field.

Implemented: seed=-1 (random, as None), detokenize=False (token ids only, no text),
truncate_prompt_tokens (keep the last k prompt tokens; -1 keeps max_model_len), and
spaces_between_special_tokens=True (what the detokenizer does). Refused while ladle's sampler
lacks them, when set to anything that would change the result: logit_bias, allowed_token_ids,
bad_words, prompt_logprobs, logits_processors, structured / guided decoding.
"""

from __future__ import annotations

from typing import Any

# field -> why it is refused (only when set to a value that would have an effect).
UNSUPPORTED_SAMPLING_FIELDS = {
    "logit_bias": "logit_bias is not supported by ladle yet",
    "allowed_token_ids": "allowed_token_ids is not supported by ladle yet",
    "bad_words": "bad_words is not supported by ladle yet",
    "prompt_logprobs": "prompt_logprobs is not supported by ladle yet (prompt logprobs are not "
    "computed)",
    "logits_processors": "logits_processors is not supported by ladle",
    "structured_outputs": "structured output is not supported by ladle yet",
    "guided_decoding": "structured output is not supported by ladle yet",
}


def validate_sampling_extras(params: Any) -> None:
    """Raise ValueError naming the first vLLM field that is invalid or that ladle cannot do."""
    for name, reason in UNSUPPORTED_SAMPLING_FIELDS.items():
        value = getattr(params, name, None)
        if value is not None and value != {} and value != [] and value is not False:
            raise ValueError(f"{name}: {reason}")
    truncate = params.truncate_prompt_tokens
    if truncate is not None and not (
        isinstance(truncate, int)
        and not isinstance(truncate, bool)
        and (truncate >= 1 or truncate == -1)
    ):
        raise ValueError(f"truncate_prompt_tokens must be >= 1 or -1, got {truncate!r}")
    if not isinstance(params.detokenize, bool):
        raise ValueError(f"detokenize must be a bool, got {params.detokenize!r}")
    if not params.detokenize and params.stop:
        raise ValueError("stop strings need detokenize=True (they are matched in the text)")
    if params.spaces_between_special_tokens is not True:
        raise ValueError(
            "spaces_between_special_tokens=False is not supported by ladle (special tokens are "
            "decoded with the tokenizer's own spacing)"
        )
