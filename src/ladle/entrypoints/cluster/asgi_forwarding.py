"""An HTTP request carried from the ingress to a replica as plain data, and run there through
ladle's own FastAPI app in-process: every route, error body, auth check and stream is exactly
`ladle serve`'s, because it is the same app.

The replica answers with a stream: first a ResponseStart (status, headers), then body chunks.
When the ingress stops reading (client gone, or cancelled) the app sees http.disconnect, which
aborts the request in the engine as it would under uvicorn.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

logger = logging.getLogger("ladle.cluster")


@dataclasses.dataclass(frozen=True)
class ForwardedRequest:
    method: str
    path: str
    query_string: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclasses.dataclass(frozen=True)
class ResponseStart:
    status: int
    headers: list[tuple[bytes, bytes]]
    replica_id: str = ""  # set by the replica that answers: the ingress counts per replica


async def run_asgi_request(app: Any, request: ForwardedRequest) -> AsyncIterator[Any]:
    """Yields a ResponseStart, then the body's non-empty chunks (bytes)."""
    messages: asyncio.Queue[dict | None] = asyncio.Queue()
    disconnected = asyncio.Event()
    body_sent = False

    async def receive() -> dict:
        nonlocal body_sent
        if not body_sent:
            body_sent = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        await messages.put(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": request.query_string,
        "root_path": "",
        "headers": request.headers,
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
    }

    async def run_app() -> None:
        try:
            await app(scope, receive, send)
        except Exception:  # the app already sent its 500; keep the replica serving
            logger.exception("error in the app for %s %s", request.method, request.path)
        finally:
            messages.put_nowait(None)

    task = asyncio.create_task(run_app())
    try:
        while (message := await messages.get()) is not None:
            if message["type"] == "http.response.start":
                yield ResponseStart(message["status"], list(message.get("headers", [])))
            elif message["type"] == "http.response.body":
                # Body chunks that are already waiting go out as one: each yield is one object
                # through Ray to the ingress, and under load the replica falls behind its app.
                # Nothing is held back to wait for more.
                body, finished = bytearray(message.get("body", b"")), False
                while not (finished := not message.get("more_body", False)):
                    if messages.empty():
                        break
                    message = messages.get_nowait()
                    if message is None or message["type"] != "http.response.body":
                        finished = True  # the app ended without closing the body
                        break
                    body += message.get("body", b"")
                if body:
                    yield bytes(body)
                if finished:
                    break
    finally:
        disconnected.set()
        if not task.done():
            # The app notices the disconnect and aborts the request; give it a moment.
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=5.0)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
