"""Logprobs in the two shapes OpenAI uses: the legacy completions dict-of-lists and the chat
list of token objects."""

from __future__ import annotations

from collections.abc import Callable

from ladle.entrypoints.openai.protocol import (
    ChatChoiceLogprobs,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionLogprobs,
)
from ladle.model.tokenizer import TextTokenizer
from ladle.protocol.messages import TokenLogprobs

_MAX_CACHED_TOKENS = 1 << 17


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's printable stand-in character for each byte (GPT-2's table), inverted."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    characters = list(printable)
    next_code = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            characters.append(256 + next_code)
            next_code += 1
    return {chr(character): byte for byte, character in zip(printable, characters)}


def token_id_label(token_id: int) -> str:
    """vLLM's --return-tokens-as-token-ids name of a token: every token, JSON-safe or not, is
    identifiable (a byte-level piece that splits a character has no text of its own)."""
    return f"token_id:{token_id}"


class TokenTexts:
    """The text and bytes of single token ids, cached: logprobs name every candidate token.

    as_token_ids: logprobs name tokens `token_id:N` (vLLM's --return-tokens-as-token-ids, or the
    request field); without a tokenizer they always do. text() stays the decoded text, which
    text offsets count in.
    """

    def __init__(self, tokenizer: TextTokenizer | None, as_token_ids: bool = False) -> None:
        self._tokenizer = tokenizer
        self.as_token_ids = as_token_ids or tokenizer is None
        self._cache: dict[int, str] = {}
        self._byte_cache: dict[int, list[int]] = {}
        # A byte-level BPE token is a run of bytes that may split a character; its decoded text
        # then shows U+FFFD, but OpenAI's `bytes` field must carry the real bytes.
        self._byte_alphabet: dict[str, int] | None = None
        if tokenizer is not None:
            backend = getattr(tokenizer.hf_tokenizer, "backend_tokenizer", None)
            decoder = getattr(backend, "decoder", None)
            if type(decoder).__name__ == "ByteLevel":
                self._byte_alphabet = _byte_level_alphabet()

    def token_bytes(self, token_id: int) -> list[int]:
        """OpenAI's `bytes`: the token's own bytes, or its label's under as_token_ids (as vLLM
        gives them, the bytes of the `token` field)."""
        if self.as_token_ids:
            return list(token_id_label(token_id).encode("utf-8"))
        cached = self._byte_cache.get(token_id)
        if cached is not None:
            return cached
        result = None
        if self._byte_alphabet is not None:
            piece = self._tokenizer.hf_tokenizer.convert_ids_to_tokens(token_id)
            if piece and all(character in self._byte_alphabet for character in piece):
                result = [self._byte_alphabet[character] for character in piece]
        if result is None:
            result = list(self.text(token_id).encode("utf-8"))
        if len(self._byte_cache) < _MAX_CACHED_TOKENS:
            self._byte_cache[token_id] = result
        return result

    def __call__(self, token_id: int) -> str:
        """The name logprobs give the token (its `token` field, its key in top_logprobs)."""
        if self.as_token_ids:
            return token_id_label(token_id)
        return self.text(token_id)

    def text(self, token_id: int) -> str:
        """The token's decoded text (its label when there is no tokenizer, whose text is
        empty): what text offsets advance by."""
        if self._tokenizer is None:
            return token_id_label(token_id)
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._cache) < _MAX_CACHED_TOKENS:
                self._cache[token_id] = text
        return text


def legacy_top_logprobs(
    entry: TokenLogprobs, token_text: Callable[[int], str], num_top: int
) -> dict[str, float]:
    """A position's legacy `top_logprobs`: the chosen token, then the num_top most likely
    (OpenAI: "the API will always return the logprob of the sampled token, so there may be up
    to logprobs+1 elements"; vLLM alike; logprobs=0 gives the chosen token alone)."""
    top = {token_text(entry.token_id): entry.logprob}
    for token_id, logprob in zip(entry.top_token_ids[:num_top], entry.top_logprobs[:num_top]):
        top[token_text(token_id)] = logprob
    return top


def completion_logprobs(
    entries: list[TokenLogprobs], token_text: TokenTexts, num_top: int, text_offset: int
) -> CompletionLogprobs:
    """Legacy shape; text_offset is where the first of these tokens starts in the choice's text."""
    fields = completion_logprobs_fields(entries, token_text, num_top, text_offset)
    return CompletionLogprobs(**fields)


def completion_logprobs_fields(
    entries: list[TokenLogprobs], token_text: TokenTexts, num_top: int, text_offset: int
) -> dict[str, list]:
    """completion_logprobs' fields as a plain dict in the model's order (a streamed chunk is
    encoded from it without building the model)."""
    text_offsets: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    top_logprobs: list[dict[str, float] | None] = []
    offset = text_offset
    for entry in entries:
        tokens.append(token_text(entry.token_id))
        token_logprobs.append(entry.logprob)
        text_offsets.append(offset)
        offset += len(token_text.text(entry.token_id))
        top_logprobs.append(legacy_top_logprobs(entry, token_text, num_top))
    return {
        "text_offset": text_offsets,
        "token_logprobs": token_logprobs,
        "tokens": tokens,
        "top_logprobs": top_logprobs,
    }


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
                bytes=token_text.token_bytes(token_id),
            )
            for token_id, logprob in list(zip(entry.top_token_ids, entry.top_logprobs))[:num_top]
        ]
        content.append(
            ChatTokenLogprob(
                token=text,
                logprob=entry.logprob,
                bytes=token_text.token_bytes(entry.token_id),
                top_logprobs=top,
            )
        )
    return ChatChoiceLogprobs(content=content)
