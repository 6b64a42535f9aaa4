"""vLLM's offline prompt forms: a string, a token-id list, or a TextPrompt / TokensPrompt dict.

    TextPrompt:   {"prompt": "text"}
    TokensPrompt: {"prompt_token_ids": [1, 2, 3]}   (an optional "prompt" is kept as its text)

Keys ladle cannot act on (multi_modal_data, mm_processor_kwargs, ...) are a ValueError naming
them, never silently dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict


class TextPrompt(TypedDict, total=False):
    """A text prompt, as vLLM's `TextPrompt`."""

    prompt: str
    cache_salt: str


class TokensPrompt(TypedDict, total=False):
    """A prompt of token ids, as vLLM's `TokensPrompt`."""

    prompt_token_ids: list[int]
    prompt: str
    cache_salt: str


def cache_salt_of(prompt: Any) -> str | None:
    """A prompt dict's cache_salt (vLLM's key): its prefix-cache blocks are shared only with
    prompts of the same salt. None when it has none."""
    return prompt.get("cache_salt") if isinstance(prompt, dict) else None


PromptType = str | Sequence[int] | TextPrompt | TokensPrompt
_ALLOWED_KEYS = {"prompt", "prompt_token_ids", "cache_salt"}  # the salt: cache_salt_of()


def as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    """One prompt or a list of them -> a list (a flat list of ints is one token prompt)."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    prompts = list(prompts)
    if prompts and all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
        return [prompts]
    return prompts


def split_prompt(prompt: Any) -> tuple[str | None, list[int] | None]:
    """(text, token ids) of one prompt; exactly one of them is what the model reads: the ids
    when given, else the text. Raises ValueError naming what is wrong."""
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, dict):
        unknown = sorted(set(prompt) - _ALLOWED_KEYS)
        if unknown:
            raise ValueError(
                f"prompt keys {unknown} are not supported by ladle (it takes 'prompt' or "
                "'prompt_token_ids')"
            )
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), _token_ids(prompt["prompt_token_ids"])
        if "prompt" in prompt:
            text = prompt["prompt"]
            if not isinstance(text, str):
                raise ValueError(f"'prompt' must be a string, got {type(text).__name__}")
            return text, None
        raise ValueError("a prompt dict needs 'prompt' (text) or 'prompt_token_ids'")
    return None, _token_ids(prompt)


def _token_ids(value: Any) -> list[int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError("a token-id prompt must be a list of integers")
    token_ids = list(value)
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in token_ids):
        raise ValueError("a token-id prompt must be a list of integers")
    return token_ids
