"""vLLM's --enable-request-id-headers: every HTTP response carries an `X-Request-Id` header, the
one the request sent (so a caller or proxy can match its own id with the server's log) or else
a new random one. Off by default, as in vLLM.

A plain ASGI middleware rather than Starlette's BaseHTTPMiddleware: it only edits the response's
first message, so streamed responses pass through unbuffered.
"""

from __future__ import annotations

import uuid

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "X-Request-Id"


class RequestIdHeaderMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = Headers(scope=scope).get(HEADER) or uuid.uuid4().hex

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)
