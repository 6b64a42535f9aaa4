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
# A request's line and headers, at most, with httptools, which keeps any number of header bytes
# (h11 refuses a head still incomplete past 16 KiB).
MAX_HEAD_BYTES = 64 * 1024


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


class _RequestDeadline:
    """The deadline timer both protocol classes share (they set `loop`, `transport`, `cycle`)."""

    _request_timer: asyncio.TimerHandle | None = None
    _request_timeout_s: float

    def _arm_request_timer(self) -> None:
        self._disarm_request_timer()
        self._request_timer = self.loop.call_later(  # type: ignore[attr-defined]
            self._request_timeout_s, self._on_request_timeout
        )

    def _disarm_request_timer(self) -> None:
        if self._request_timer is not None:
            self._request_timer.cancel()
            self._request_timer = None

    def _is_receiving(self) -> bool:
        raise NotImplementedError

    def _on_request_timeout(self) -> None:
        self._request_timer = None
        transport = self.transport  # type: ignore[attr-defined]
        if transport.is_closing() or not self._is_receiving():
            return
        # The previous request's cycle while a kept-alive connection sends the next one's
        # headers; this request's own once its headers are in: never write a 408 into a
        # response already under way.
        cycle = self.cycle  # type: ignore[attr-defined]
        if cycle is None or cycle.response_complete or not cycle.response_started:
            transport.write(_timeout_response(self._request_timeout_s))
        transport.close()


class _AbortIdleTlsAtShutdown:
    """At shutdown uvicorn closes an idle kept-alive connection. Over TLS, close() waits for the
    client's close_notify (asyncio's ssl_shutdown_timeout, 30 s), which an idle client never
    sends, so one idle HTTPS client held the drain for the whole --shutdown-timeout (30.2 s
    against 0.3 s over plain HTTP). Nothing is in flight there: the connection is aborted."""

    def shutdown(self) -> None:
        super().shutdown()  # type: ignore[misc]
        transport = self.transport  # type: ignore[attr-defined]
        if transport.is_closing() and transport.get_extra_info("sslcontext") is not None:
            transport.abort()


def make_timed_protocol(request_timeout_s: float) -> type[H11Protocol]:
    """An H11Protocol class (for uvicorn.Config(http=...)) with this request deadline."""

    class TimedH11Protocol(_RequestDeadline, _AbortIdleTlsAtShutdown, H11Protocol):
        _request_timeout_s = request_timeout_s

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_request_timer()

        def data_received(self, data: bytes) -> None:
            # The first byte of a request on a kept-alive connection starts its deadline.
            if self._request_timer is None and self.conn.their_state is h11.IDLE:
                self._arm_request_timer()
            super().data_received(data)
            if not self._is_receiving():
                self._disarm_request_timer()

        def on_response_complete(self) -> None:
            self._disarm_request_timer()
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_request_timer()
            super().connection_lost(exc)

        def _is_receiving(self) -> bool:
            return self.conn.their_state in _STILL_RECEIVING

    return TimedH11Protocol


def make_timed_httptools_protocol(request_timeout_s: float) -> type:
    """The same deadline on uvicorn's httptools protocol (C parser; cheaper per streamed chunk
    than h11, which matters where one process relays many streams: the front of `ladle serve
    --replicas N`), and a bound on a request's head (MAX_HEAD_BYTES). Needs httptools (it comes
    with Ray Serve, uvicorn[standard])."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class TimedHttpToolsProtocol(_RequestDeadline, _AbortIdleTlsAtShutdown, HttpToolsProtocol):
        _request_timeout_s = request_timeout_s
        _receiving = True  # from the connection's opening: a silent client gets the 408
        _head_bytes = 0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_request_timer()

        def on_message_begin(self) -> None:
            # The first byte of a request on a kept-alive connection starts its deadline.
            if not self._receiving:
                self._receiving = True
                self._arm_request_timer()
            self._head_bytes = 0
            super().on_message_begin()

        def on_url(self, url: bytes) -> None:
            self._count_head_bytes(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head_bytes(len(name) + len(value))
            super().on_header(name, value)

        def _count_head_bytes(self, num_bytes: int) -> None:
            # Raised in a parser callback, this makes uvicorn answer 400 and close, as it does
            # for a head over h11's limit.
            self._head_bytes += num_bytes
            if self._head_bytes > MAX_HEAD_BYTES:
                raise ValueError(f"request line and headers over {MAX_HEAD_BYTES} bytes")

        def on_message_complete(self) -> None:
            self._receiving = False
            self._disarm_request_timer()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_request_timer()
            super().connection_lost(exc)

        def _is_receiving(self) -> bool:
            return self._receiving

    return TimedHttpToolsProtocol


def make_fastest_timed_protocol(request_timeout_s: float) -> type:
    """httptools' protocol when httptools is installed, else h11's; both with the deadline."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return make_timed_protocol(request_timeout_s)
    return make_timed_httptools_protocol(request_timeout_s)
