"""Logprobs in the two shapes OpenAI uses: the legacy completions dict-of-lists and the chat
list of token objects."""

from __future__ import annotations

from ladle.engine.messages import TokenLogprobs
from ladle.engine.tokenizer import TextTokenizer
from ladle.entrypoints.openai.protocol import (
    ChatChoiceLogprobs,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionLogprobs,
)

_MAX_CACHED_TOKENS = 1 << 17


class TokenTexts:
    """The text of single token ids, cached: logprobs name every candidate token."""

    def __init__(self, tokenizer: TextTokenizer | None) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if self._tokenizer is None:
                text = f"token_id:{token_id}"
            else:
                text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._cache) < _MAX_CACHED_TOKENS:
                self._cache[token_id] = text
        return text


def completion_logprobs(
    entries: list[TokenLogprobs], token_text: TokenTexts, num_top: int, text_offset: int
) -> CompletionLogprobs:
    """Legacy shape; text_offset is where the first of these tokens starts in the choice's text."""
    result = CompletionLogprobs()
    offset = text_offset
    for entry in entries:
        text = token_text(entry.token_id)
        result.tokens.append(text)
        result.token_logprobs.append(entry.logprob)
        result.text_offset.append(offset)
        offset += len(text)
        if num_top > 0:
            result.top_logprobs.append(
                {
                    token_text(token_id): logprob
                    for token_id, logprob in zip(entry.top_token_ids, entry.top_logprobs)
                }
            )
        else:
            result.top_logprobs.append(None)
    return result


def chat_logprobs(
    entries: list[TokenLogprobs], token_text: TokenTexts, num_top: int
) -> ChatChoiceLogprobs:
    content = []
    for entry in entries:
        text = token_text(entry.token_id)
        top = [
            ChatTopLogprob(
                token=token_text(token_id),
                logprob=logprob,
                bytes=list(token_text(token_id).encode("utf-8")),
            )
            for token_id, logprob in list(zip(entry.top_token_ids, entry.top_logprobs))[:num_top]
        ]
        content.append(
            ChatTokenLogprob(
                token=text, logprob=entry.logprob, bytes=list(text.encode("utf-8")), top_logprobs=top
            )
        )
    return ChatChoiceLogprobs(content=content)
