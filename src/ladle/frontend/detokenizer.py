"""Incremental detokenization: token ids in, text deltas out, in O(new tokens) per step.

Decoding every output id again at each step costs O(n) per token, O(n^2) per request. Decoding
each new token alone is wrong twice over: a character whose UTF-8 bytes are split across
byte-level tokens decodes to U+FFFD halves, and SentencePiece-style decoders drop the leading
space of the first token they see. So we decode a short window of ids with and without the new
tokens and emit the difference:

    window:  prefix tokens (already emitted) | pending tokens (not yet emitted)
             0 ........................ read_offset ..................... end

The prefix tokens give the decoder its context (the word boundary before the new token, the
start of a character); the text they decode to is already out, so only what follows it is new.
When the new text ends in a complete character the window moves on: the pending tokens become
the prefix for the next ones. A text ending in U+FFFD means bytes of a character are still to
come, so we wait for the next token.

Fast path: a one-token step of a fast (Rust) tokenizer goes through `tokenizers`' DecodeStream,
which runs the same window method in Rust (~1 us per token against ~30 us for two Python-side
decode() calls, measured on the default tokenizer). It is primed with this class's prompt
context (which starts on a character boundary; a context that ends mid-character waits for
the slow path's first emission), and it is kept in step with the window: each chunk it emits
moves the window on exactly as a slow step would. What it cannot do stays here: several ids
at once (the slow path, then a re-primed stream), and the final flush of a character left
unfinished, which DecodeStream would drop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from tokenizers.decoders import DecodeStream
except ImportError:  # an old tokenizers: the slow path serves alone
    DecodeStream = None

# Enough prompt tokens to give the first output token its context (a leading space, the start of
# a character) without decoding the whole prompt.
NUM_PROMPT_CONTEXT_TOKENS = 5
REPLACEMENT_CHARACTER = "\ufffd"


class IncrementalDetokenizer:
    """Turns one request's output token ids into text, a delta per call.

    The concatenated deltas equal ``hf_tokenizer.decode(output_ids, skip_special_tokens=...,
    clean_up_tokenization_spaces=False)`` when the prompt is empty, and the continuation of the
    prompt's text otherwise (so a SentencePiece word after the prompt keeps its leading space).
    Call ``flush()`` once when the request finishes: it emits text that was waiting for the rest
    of a character that never came (as U+FFFD, as a full decode would show it).
    """

    def __init__(
        self,
        hf_tokenizer: Any,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self.skip_special_tokens = skip_special_tokens
        self.token_ids: list[int] = []
        self._tokenizer = hf_tokenizer
        self._vocab_size = len(hf_tokenizer)
        context_ids = self._prompt_context(list(prompt_token_ids[-NUM_PROMPT_CONTEXT_TOKENS - 3 :]))
        self._window_ids: list[int] = context_ids
        self._read_offset = len(context_ids)
        self._prefix_text: str | None = self._decode(context_ids)
        self._text = ""
        # The Rust tokenizer behind a transformers fast tokenizer, for the DecodeStream path.
        self._backend = getattr(hf_tokenizer, "backend_tokenizer", None)
        self._stream: Any = None
        self._stream_is_stale = True  # opened (primed with the window) when first needed

    def _prompt_context(self, prompt_tail_ids: list[int]) -> list[int]:
        """The last few of the prompt's tail ids, starting on a character boundary.

        A context starting inside a character decodes to U+FFFD there; for ByteFallback, which
        decodes a run of byte tokens all or nothing, that would spoil every byte token after it
        too. A character spans at most 4 bytes, so 3 steps back always reach its start.
        """
        self._check_in_vocab(prompt_tail_ids)
        prompt_tail_ids = self._decodable(prompt_tail_ids)
        start = max(0, len(prompt_tail_ids) - NUM_PROMPT_CONTEXT_TOKENS)
        while start > 0 and self._decode(prompt_tail_ids[start:]).startswith(REPLACEMENT_CHARACTER):
            start -= 1
        return prompt_tail_ids[start:]

    @property
    def text(self) -> str:
        """All output text emitted so far."""
        return self._text

    def add_tokens(self, new_token_ids: Sequence[int]) -> str:
        """Appends output token ids; returns the text they complete (may be empty)."""
        new_token_ids = list(new_token_ids)
        self._check_in_vocab(new_token_ids)
        self.token_ids.extend(new_token_ids)
        new_token_ids = self._decodable(new_token_ids)
        if not new_token_ids:
            return ""
        if len(new_token_ids) == 1:
            if self._stream_is_stale:
                self._stream, self._stream_is_stale = self._open_stream(), False
            if self._stream is not None:
                return self._step_stream(new_token_ids[0])
        delta = self._add_slowly(new_token_ids)
        # Re-primed at the next one-token step (not now: a finishing request never takes one).
        self._stream, self._stream_is_stale = None, True
        return delta

    def _open_stream(self) -> Any:
        """A DecodeStream primed with the window's emitted ids, fed its pending ones; None
        where the fast path cannot serve (no Rust tokenizer, an old `tokenizers`)."""
        if self._backend is None or DecodeStream is None:
            return None
        if self._emitted_prefix_text().endswith(REPLACEMENT_CHARACTER):
            # A prompt cut inside a character: primed so, DecodeStream would emit the prefix
            # again. The slow path serves until its first emission moves the window on.
            return None
        try:
            stream = DecodeStream(
                ids=self._window_ids[: self._read_offset],
                skip_special_tokens=self.skip_special_tokens,
            )
            pending = self._window_ids[self._read_offset :]
            if pending:
                stream.step(self._backend, pending)
        except Exception:  # noqa: BLE001 - an old DecodeStream without ids=: the slow path serves
            return None
        return stream

    def _step_stream(self, token_id: int) -> str:
        try:
            chunk = self._stream.step(self._backend, token_id)
        except Exception:  # noqa: BLE001 - the Rust side refused (a prefix it did not expect)
            self._stream, self._stream_is_stale = None, True
            return self._add_slowly([token_id])
        self._window_ids.append(token_id)
        if not chunk:
            return ""  # waiting for the rest of a character (or a skipped special token)
        # The window moves on as _advance moves it; its prefix text is decoded only if the
        # slow path needs it again.
        del self._window_ids[: self._read_offset]
        self._read_offset = len(self._window_ids)
        self._prefix_text = None
        text = self._text
        self._text = ""
        text += chunk
        self._text = text
        return chunk

    def _add_slowly(self, new_token_ids: list[int]) -> str:
        self._window_ids.extend(new_token_ids)
        delta = self._emit_up_to(len(self._window_ids))
        if not delta and len(new_token_ids) > 1:
            # The batch ends mid-character; earlier tokens in it may still complete text.
            # Offsets shift as the window moves, but the distance from its end does not.
            pieces = []
            for num_after in range(len(new_token_ids) - 1, -1, -1):
                pieces.append(self._emit_up_to(len(self._window_ids) - num_after))
            delta = "".join(pieces)
        return delta

    def flush(self) -> str:
        """Emits whatever text is still held back; call when the request has finished."""
        end = len(self._window_ids)
        if end == self._read_offset:
            return ""
        new_text = self._decode(self._window_ids)
        if len(new_text) <= len(self._emitted_prefix_text()):
            return ""
        return self._advance(new_text, end)

    def _emitted_prefix_text(self) -> str:
        """The text of the window's emitted ids (decoded again after fast-path steps)."""
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._window_ids[: self._read_offset])
        return self._prefix_text

    def _emit_up_to(self, end: int) -> str:
        """Emits the text of pending window ids before `end` if it ends in a whole character."""
        if end <= self._read_offset:
            return ""
        new_text = self._decode(self._window_ids[:end])
        # Not longer: special tokens being skipped, or a decoder still waiting on context.
        prefix_text = self._emitted_prefix_text()
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHARACTER):
            return ""
        return self._advance(new_text, end)

    def _advance(self, new_text: str, end: int) -> str:
        delta = new_text[len(self._emitted_prefix_text()) :]
        self._prefix_text = self._decode(self._window_ids[self._read_offset : end])
        del self._window_ids[: self._read_offset]
        self._read_offset = end - self._read_offset
        # A local name lets CPython grow the string in place instead of copying all the text.
        text = self._text
        self._text = ""
        text += delta
        self._text = text
        return delta

    def _decode(self, token_ids: list[int]) -> str:
        if not token_ids:
            return ""
        # No clean-up: it rewrites text across token boundaries (" ." -> "."), which would change
        # characters we have already emitted.
        return self._tokenizer.decode(
            token_ids,
            skip_special_tokens=self.skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )

    def _check_in_vocab(self, token_ids: list[int]) -> None:
        for token_id in token_ids:
            if token_id < 0:
                raise ValueError(f"token id {token_id} is negative")

    def _decodable(self, token_ids: list[int]) -> list[int]:
        """Ids the tokenizer knows. A model's embedding is often padded past its tokenizer
        (Qwen: 151936 rows for ~151.7k tokens); a sampled padding id is kept in token_ids but
        decodes to no text, as it has none."""
        if all(token_id < self._vocab_size for token_id in token_ids):
            return token_ids
        return [token_id for token_id in token_ids if token_id < self._vocab_size]
