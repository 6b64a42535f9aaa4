"""One streaming request to an OpenAI-compatible server, timed chunk by chunk.

Works against any server that speaks the OpenAI streaming protocol (server-sent events ending in
`data: [DONE]`): ladle, vLLM, SGLang, `transformers serve`. Token counts come from the final
usage chunk (`stream_options.include_usage`) when the server sends one, else from the number of
content chunks.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from ladle.bench.serve_stats import RequestRecord


@dataclass
class BenchRequest:
    """One request of a workload: a chat (messages) or a completion (prompt text or ids)."""

    workload: str
    prompt_len: int  # the expected prompt length in tokens
    max_tokens: int
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None
    extra_body: dict = field(default_factory=dict)  # tools, priority, ignore_eos, ...

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    def payload(self, model: str, temperature: float) -> dict:
        body: dict = {
            "model": model,
            "max_tokens": self.max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.is_chat:
            body["messages"] = self.messages
        else:
            body["prompt"] = self.prompt
        body.update(self.extra_body)
        return body


def _chunk_has_content(chunk: dict, is_chat: bool) -> bool:
    for choice in chunk.get("choices") or ():
        if is_chat:
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
                return True
        elif choice.get("text") or choice.get("logprobs"):
            return True
    return False


async def send_request(
    http: httpx.AsyncClient,
    base_url: str,
    request: BenchRequest,
    record: RequestRecord,
    model: str,
    temperature: float,
    headers: dict[str, str],
    run_start: float,
) -> RequestRecord:
    """Send one streaming request and fill `record` (never raises for a failed request)."""
    path = "/v1/chat/completions" if request.is_chat else "/v1/completions"
    body = request.payload(model, temperature)
    record.prompt_tokens = request.prompt_len
    sent = time.perf_counter()
    record.start = sent - run_start
    last_event = sent
    num_chunks = 0
    usage: dict | None = None
    try:
        async with http.stream("POST", base_url + path, json=body, headers=headers) as response:
            record.status = response.status_code
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                record.error = _error_message(text, response.status_code)
                record.e2e = time.perf_counter() - sent
                return record
            async for line in _sse_lines(response):
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    record.error = _error_message(data, response.status_code)
                    break
                now = time.perf_counter()
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if not _chunk_has_content(chunk, request.is_chat):
                    continue
                if record.ttft is None:
                    record.ttft = now - sent
                else:
                    record.itl.append(now - last_event)
                last_event = now
                num_chunks += 1
    except (httpx.HTTPError, json.JSONDecodeError, OSError) as error:
        record.error = f"{type(error).__name__}: {error}"
    record.e2e = time.perf_counter() - sent
    if usage is not None:
        record.prompt_tokens = int(usage.get("prompt_tokens") or request.prompt_len)
        record.output_tokens = int(usage.get("completion_tokens") or num_chunks)
    else:
        record.output_tokens = num_chunks
    if record.error is None and record.ttft is None:
        record.error = "the stream ended without any content"
    return record


async def _sse_lines(response: httpx.Response):
    """The stream's lines, split on newlines only. (httpx's aiter_lines also splits on the
    Unicode line separators, such as U+2028 or U+0085, that a generated token may hold inside
    a JSON string, which cut a chunk in two.)"""
    pending = b""
    async for data in response.aiter_bytes():
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r").decode("utf-8")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8")


def _error_message(text: str, status: int) -> str:
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (json.JSONDecodeError, AttributeError):
        message = text
    return f"HTTP {status}: {str(message)[:300]}"
