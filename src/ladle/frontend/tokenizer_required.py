"""The one wording of "this needs a tokenizer" errors, naming skip_tokenizer_init when that
option is why there is none (vLLM's token-in/token-out mode), so a user sees which switch to
turn off rather than a generic "no tokenizer".

    reason = no_tokenizer_reason(skip_tokenizer_init=True)
    raise ValueError(needs_tokenizer("stop strings", reason))
    # stop strings need a tokenizer, and the engine runs with skip_tokenizer_init (...)
"""

from __future__ import annotations

SKIPPED_REASON = (
    "the engine runs with skip_tokenizer_init, which loads none (send token ids; stop with "
    "stop_token_ids)"
)
ABSENT_REASON = "this model has none"


def no_tokenizer_reason(skip_tokenizer_init: bool) -> str:
    """Why there is no tokenizer: the option, or a model that came without one."""
    return SKIPPED_REASON if skip_tokenizer_init else ABSENT_REASON


def needs_tokenizer(feature: str, reason: str) -> str:
    """The error for `feature` (plural noun phrase, e.g. 'text prompts') asked without one."""
    return f"{feature} need a tokenizer, and {reason}"
