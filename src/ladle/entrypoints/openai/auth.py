"""Bearer-token check for the /v1 routes, and the request-body size limit.

The key comparison is constant-time (hmac.compare_digest over bytes), so response timing says
nothing about how much of a guessed key was right.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from fastapi import Request

from ladle.entrypoints.openai.errors import AuthenticationError, RequestTooLargeError


def make_api_key_check(api_key: str | None) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency raising AuthenticationError (401) unless the request carries
    `Authorization: Bearer <api_key>`; it lets everything through when api_key is None."""
    expected = api_key.encode("utf-8") if api_key else None

    async def check_api_key(request: Request) -> None:
        if expected is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        # Compare even when the scheme is wrong, so both failures take the same time.
        matches = hmac.compare_digest(token.strip().encode("utf-8"), expected)
        if scheme.lower() != "bearer" or not matches:
            raise AuthenticationError(
                "Incorrect or missing API key; send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
            )

    return check_api_key


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request body, or RequestTooLargeError (413) as soon as it passes max_bytes: a
    declared Content-Length is refused before reading anything, a chunked body on the way."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(max_bytes: int) -> RequestTooLargeError:
    return RequestTooLargeError(
        f"the request body is larger than this server's limit of {max_bytes} bytes "
        "(--max-request-bytes)",
        code="request_too_large",
    )
