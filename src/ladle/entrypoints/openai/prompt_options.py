"""vLLM's prompt extras on the server: truncate_prompt_tokens, chat echo, usage in every
streamed chunk (stream_options.continuous_usage_stats) and the prompt_logprobs response field.

add_special_tokens and continue_final_message are one argument each to the tokenizer and the
chat template (serving_completions.py / serving_chat.py); cache_salt travels with the request's
SamplingParams into its block hashes (core/block_hash.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ladle.entrypoints.openai.errors import BadRequestError
from ladle.entrypoints.openai.logprobs import TokenTexts, legacy_top_logprobs
from ladle.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionLogprobs,
    StreamOptions,
    UsageInfo,
)
from ladle.protocol.messages import TokenLogprobs


def truncate_prompt(
    token_ids: list[int], truncate_prompt_tokens: int | None, max_model_len: int
) -> list[int]:
    """The prompt's last k tokens (k = truncate_prompt_tokens; -1 means max_model_len), as vLLM
    keeps them; the prompt unchanged when it is no longer than k or k is None."""
    if truncate_prompt_tokens is None:
        return token_ids
    if truncate_prompt_tokens == -1:
        keep = max_model_len
    elif truncate_prompt_tokens >= 1:
        keep = truncate_prompt_tokens
    else:
        raise BadRequestError(
            f"truncate_prompt_tokens must be >= 1 or -1 (max_model_len), got "
            f"{truncate_prompt_tokens}",
            param="truncate_prompt_tokens",
        )
    if keep > max_model_len:
        raise BadRequestError(
            f"truncate_prompt_tokens ({keep}) is larger than max_model_len ({max_model_len})",
            param="truncate_prompt_tokens",
        )
    return token_ids if len(token_ids) <= keep else token_ids[-keep:]


def check_chat_prompt_options(request: ChatCompletionRequest) -> None:
    """400 for combinations of chat prompt options that contradict each other."""
    if request.continue_final_message and request.add_generation_prompt:
        raise BadRequestError(
            "continue_final_message and add_generation_prompt cannot both be true (set "
            "add_generation_prompt to false to continue the last message)",
            param="continue_final_message",
        )


def chat_echo_text(request: ChatCompletionRequest, reply_role: str = "assistant") -> str:
    """What `echo` puts before each reply: the last message's text when its role is the
    reply's (the reply continues it), else nothing, as vLLM does."""
    if not request.echo or request.messages[-1].role != reply_role:
        return ""
    return request.messages[-1].text()


def wants_continuous_usage(stream_options: StreamOptions | None) -> bool:
    """Usage in every chunk: vLLM's continuous_usage_stats, which needs include_usage."""
    return bool(
        stream_options and stream_options.include_usage and stream_options.continuous_usage_stats
    )


def usage_so_far(num_prompt_tokens: int, num_completion_tokens: int) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=num_completion_tokens,
        total_tokens=num_prompt_tokens + num_completion_tokens,
    )


def check_prompt_logprobs(prompt_logprobs: int | None, stream: bool) -> None:
    if prompt_logprobs is not None and stream:
        raise BadRequestError(
            "prompt_logprobs is not supported with stream: true (ask without streaming)",
            param="prompt_logprobs",
        )


def prompt_logprobs_json(
    entries: list[TokenLogprobs | None] | None, token_text: Callable[[int], str]
) -> list[dict[str, dict[str, Any]] | None] | None:
    """vLLM's response shape: None for the first prompt token, then {token id: {logprob, rank,
    decoded_token}} with the prompt's own token first and then the top candidates."""
    if entries is None:
        return None
    result: list[dict[str, dict[str, Any]] | None] = []
    for entry in entries:
        if entry is None:
            result.append(None)
            continue
        position = {
            str(entry.token_id): _logprob(entry.logprob, entry.rank, entry.token_id, token_text)
        }
        for rank, (token_id, logprob) in enumerate(
            zip(entry.top_token_ids, entry.top_logprobs), start=1
        ):
            position.setdefault(str(token_id), _logprob(logprob, rank, token_id, token_text))
        result.append(position)
    return result


def _logprob(logprob: float, rank: int, token_id: int, token_text) -> dict[str, Any]:
    # -inf (a token the model rules out) is not JSON: vLLM clamps the same way.
    return {"logprob": max(logprob, -9999.0), "rank": rank, "decoded_token": token_text(token_id)}


def echo_logprobs(
    prompt_token_ids: list[int],
    entries: list[TokenLogprobs | None] | None,
    token_text: TokenTexts,
    num_top: int,
) -> CompletionLogprobs:
    """The prompt's part of a completion's legacy logprobs under echo, as OpenAI gives it: each
    prompt token with its logprob (None for the first, which nothing predicts) and its top
    candidates, text offsets from the start of the echoed prompt."""
    result = CompletionLogprobs()
    offset = 0
    for position, token_id in enumerate(prompt_token_ids):
        entry = entries[position] if entries is not None and position < len(entries) else None
        result.tokens.append(token_text(token_id))
        result.text_offset.append(offset)
        offset += len(token_text.text(token_id))
        result.token_logprobs.append(None if entry is None else entry.logprob)
        result.top_logprobs.append(
            None if entry is None else legacy_top_logprobs(entry, token_text, num_top)
        )
    return result


def join_logprobs(first: CompletionLogprobs, second: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(
        text_offset=first.text_offset + second.text_offset,
        token_logprobs=first.token_logprobs + second.token_logprobs,
        tokens=first.tokens + second.tokens,
        top_logprobs=first.top_logprobs + second.top_logprobs,
    )
