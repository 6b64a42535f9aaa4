"""uvicorn's HTTP/1.1 protocol with a deadline on receiving each request.

uvicorn closes idle keep-alive connections (timeout_keep_alive) and can cap connections
(limit_concurrency, answered 503), but it waits forever for a request's headers and body: a
client that trickles a byte a second, or connects and says nothing, holds a socket and memory
for good. Here every request must arrive whole (headers and body) within request_timeout_s of
its first byte (or of the connection opening); otherwise the server answers 408 and closes, as
nginx does (client_header_timeout / client_body_timeout, 60 s by default).

The deadline stops as soon as the request has arrived: generating and streaming the response
may take as long as it takes.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

_STILL_RECEIVING = (h11.IDLE, h11.SEND_BODY)


def _timeout_response(timeout_s: float) -> bytes:
    body = json.dumps({"error": {
        "message": f"the request did not arrive within {timeout_s:g}s (headers and body)",
        "type": "invalid_request_error", "param": None, "code": "request_timeout",
    }}).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    return head + body


def make_timed_protocol(request_timeout_s: float) -> type[H11Protocol]:
    """An H11Protocol class (for uvicorn.Config(http=...)) with this request deadline."""

    class TimedH11Protocol(H11Protocol):
        _request_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_request_timer()

        def data_received(self, data: bytes) -> None:
            # The first byte of a request on a kept-alive connection starts its deadline.
            if self._request_timer is None and self.conn.their_state is h11.IDLE:
                self._arm_request_timer()
            super().data_received(data)
            if self.conn.their_state not in _STILL_RECEIVING:
                self._disarm_request_timer()

        def on_response_complete(self) -> None:
            self._disarm_request_timer()
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_request_timer()
            super().connection_lost(exc)

        def _arm_request_timer(self) -> None:
            self._disarm_request_timer()
            self._request_timer = self.loop.call_later(request_timeout_s, self._on_request_timeout)

        def _disarm_request_timer(self) -> None:
            if self._request_timer is not None:
                self._request_timer.cancel()
                self._request_timer = None

        def _on_request_timeout(self) -> None:
            self._request_timer = None
            if self.transport.is_closing() or self.conn.their_state not in _STILL_RECEIVING:
                return
            cycle = self.cycle  # the previous request's, on a kept-alive connection
            if cycle is None or cycle.response_complete or not cycle.response_started:
                self.transport.write(_timeout_response(request_timeout_s))
            self.transport.close()

    return TimedH11Protocol
