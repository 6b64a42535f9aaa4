"""One streaming request to an OpenAI-compatible server, timed chunk by chunk.

Works against any server that speaks the OpenAI streaming protocol (server-sent events ending in
`data: [DONE]`): ladle, vLLM, SGLang, `transformers serve`. Token counts come from the final
usage chunk (`stream_options.include_usage`) when the server sends one, else from the number of
content chunks.

Timing: every content chunk is one event, timed when the read that brought it returned (not when
it was parsed), so several chunks that arrived in one read share a timestamp and the gaps between
them are 0: they did arrive together. A chunk that carries several tokens (a server that merged
steps) is one event and one gap, as vLLM's bench counts it; RequestRecord.num_chunks keeps the
count, so tokens per chunk shows such merging.

The streams go through aiohttp (its HTTP parser is C): at S1's ~15,000 events/s one Python
process reading them with httpx spent 37-51 us of CPU per event, with aiohttp on uvloop 15-26 us
(scripts/served_path_bench.py, docs/benchmarks.md), and a client that falls behind bunches the
events it reads.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import aiohttp

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
    session: aiohttp.ClientSession,
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
    events = _EventTimes(sent)
    usage: dict | None = None
    try:
        async with session.post(base_url + path, json=body, headers=headers) as response:
            record.status = response.status
            if response.status != 200:
                text = (await response.read()).decode("utf-8", "replace")
                record.error = _error_message(text, response.status)
                record.e2e = time.perf_counter() - sent
                return record
            async for line, arrived in _sse_lines(response):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    record.error = _error_message(data.decode("utf-8", "replace"), response.status)
                    break
                if chunk.get("usage"):
                    usage = chunk["usage"]
                if _chunk_has_content(chunk, request.is_chat):
                    events.add(arrived)
    except (
        aiohttp.ClientError, TimeoutError, json.JSONDecodeError, UnicodeDecodeError, OSError
    ) as error:
        record.error = f"{type(error).__name__}: {error}"
    record.e2e = time.perf_counter() - sent
    record.ttft, record.itl, record.num_chunks = events.ttft, events.itl, events.count
    if usage is not None:
        record.prompt_tokens = int(usage.get("prompt_tokens") or request.prompt_len)
        record.output_tokens = int(usage.get("completion_tokens") or events.count)
    else:
        record.output_tokens = events.count
    if record.error is None and record.ttft is None:
        record.error = "the stream ended without any content"
    return record


class _EventTimes:
    """TTFT and the inter-event gaps of one stream, from each content event's arrival time."""

    def __init__(self, sent: float) -> None:
        self.sent = sent
        self.ttft: float | None = None
        self.itl: list[float] = []
        self.count = 0
        self._last = sent

    def add(self, arrived: float) -> None:
        if self.ttft is None:
            self.ttft = arrived - self.sent
        else:
            self.itl.append(arrived - self._last)
        self._last = arrived
        self.count += 1


async def _sse_lines(response: aiohttp.ClientResponse):
    """(line, arrival time) of the stream's lines, split on b"\\n" only, each timed when the
    read that completed it returned. (A line splitter that also splits on the Unicode line
    separators, as httpx's aiter_lines does, cuts a chunk whose token holds U+2028 or U+0085.)"""
    pending = b""
    async for data in response.content.iter_any():
        arrived = time.perf_counter()
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.rstrip(b"\r"), arrived
    if pending:
        yield pending.rstrip(b"\r"), time.perf_counter()


def _error_message(text: str, status: int) -> str:
    try:
        error = json.loads(text).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (json.JSONDecodeError, AttributeError):
        message = text
    return f"HTTP {status}: {str(message)[:300]}"
