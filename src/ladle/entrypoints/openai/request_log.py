"""One log line per finished HTTP request: method, route, status, tokens in/out, latency.

    [ladle] POST /v1/chat/completions 200 in=24 out=64 1.532s

An ASGI middleware times the request and reads the status from the response it sends; the
handlers add the tokens they submit to a per-request tally (a context variable the middleware
sets, so no handler signature changes). Streamed responses are logged when the stream ends. The
probes that monitoring polls (/health, /ping, /metrics) are not logged. `ladle serve
--disable-log-requests` turns it off.
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ladle.frontend.client import RequestStream

LOGGER_NAME = "ladle.requests"
UNLOGGED_PATHS = frozenset({"/health", "/ping", "/metrics"})

logger = logging.getLogger(LOGGER_NAME)


@dataclass
class RequestTally:
    """What one HTTP request sent to the engine: its prompts' tokens and its streams."""

    num_prompt_tokens: int = 0
    streams: list[RequestStream] = field(default_factory=list)

    def add(self, num_prompt_tokens: int, stream: RequestStream) -> None:
        self.num_prompt_tokens += num_prompt_tokens
        self.streams.append(stream)

    @property
    def num_generated_tokens(self) -> int:
        return sum(
            len(completion.token_ids)
            for stream in self.streams
            if stream.last_output is not None
            for completion in stream.last_output.outputs
        )


_current_tally: contextvars.ContextVar[RequestTally | None] = contextvars.ContextVar(
    "ladle_request_tally", default=None
)


def record_engine_request(num_prompt_tokens: int, stream: RequestStream) -> None:
    """Count one engine request toward the HTTP request being served (if it is logged)."""
    tally = _current_tally.get()
    if tally is not None:
        tally.add(num_prompt_tokens, stream)


class RequestLogMiddleware:
    """Pure ASGI middleware (a BaseHTTPMiddleware would buffer streamed responses)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in UNLOGGED_PATHS:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        tally = RequestTally()
        token = _current_tally.set(tally)
        status = 500  # what the client gets if the app fails before it starts a response

        async def send_and_note_status(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note_status)
        finally:
            _current_tally.reset(token)
            logger.info(
                "%s %s %d in=%d out=%d %.3fs",
                scope["method"],
                scope["path"],
                status,
                tally.num_prompt_tokens,
                tally.num_generated_tokens,
                time.perf_counter() - started,
            )


def enable_request_logging(stream: Any = None) -> None:
    """Print the request lines (INFO) to stdout, beside the server's other '[ladle]' lines."""
    if any(getattr(h, "_ladle_request_log", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(logging.Formatter("[ladle] %(message)s"))
    handler._ladle_request_log = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
