"""The server-sent events of one streamed response, encoded without a pydantic model per chunk.

A streamed completion sends one chunk per engine step per stream: at 128 streams and a 7 ms
step that is ~18,000 chunks a second from one Python process. Building and dumping pydantic
models (CompletionChunk, CompletionChoice, CompletionLogprobs) cost ~16 us a chunk; here the
fields every chunk of a response shares (id, object, created, model) are encoded once, and each
chunk's choices, plain dicts in the models' field order, go through msgspec (~1.5 us). The bytes
are those of `CompletionChunk(...).model_dump_json()` / `ChatCompletionChunk(...)`'s (tests
compare them); rarer choices (chat logprobs, reasoning and tool-call deltas) stay pydantic
models and are dumped to dicts first.
"""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import BaseModel

_encoder = msgspec.json.Encoder()


class ChunkEncoder:
    """`data: {...}\\n\\n` events of one response: {id, object, created, model, choices, usage}."""

    def __init__(self, response_id: str, object_name: str, created: int, model: str) -> None:
        head = _encoder.encode(
            {"id": response_id, "object": object_name, "created": created, "model": model}
        )
        self._head = b"data: " + head[:-1] + b',"choices":'

    def event(
        self,
        choices: list[dict[str, Any] | BaseModel],
        usage: dict[str, int] | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> bytes:
        """prompt_token_ids (chat's return_token_ids) is written after usage, only when given,
        as ChatCompletionChunk dumps it."""
        plain = [c.model_dump() if isinstance(c, BaseModel) else c for c in choices]
        tail = b""
        if prompt_token_ids is not None:
            tail = b',"prompt_token_ids":' + _encoder.encode(prompt_token_ids)
        return (
            self._head + _encoder.encode(plain) + b',"usage":' + _encoder.encode(usage) + tail
            + b"}\n\n"
        )


def completion_choice(
    index: int,
    text: str,
    logprobs: dict[str, list] | None,
    finish_reason: str | None,
    stop_reason: int | str | None,
    prompt_token_ids: list[int] | None = None,
    token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """A streamed CompletionChoice's fields, in its order (prompt_logprobs is never streamed;
    the token-id fields only when given, as the model dumps them)."""
    choice = {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "prompt_logprobs": None,
    }
    if prompt_token_ids is not None:
        choice["prompt_token_ids"] = prompt_token_ids
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return choice


def chat_choice(
    index: int,
    delta: dict[str, str],
    finish_reason: str | None = None,
    stop_reason: int | str | None = None,
    token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """A ChatStreamChoice's fields, in its order, without logprobs; delta holds ChatDelta's
    fields that are not None (role, content), as ChatDelta dumps itself; token_ids only when
    given."""
    choice = {
        "index": index,
        "delta": delta,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return choice
