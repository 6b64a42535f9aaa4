"""A request run through an ASGI app the way a replica runs it (no Ray): the response start
first, then the body; chunks the app sent while the reader was busy go out as one (fewer objects
through Ray under load), chunks sent apart are not held back."""

import asyncio

from ladle.entrypoints.cluster.asgi_forwarding import (
    ForwardedRequest,
    ResponseStart,
    run_asgi_request,
)

REQUEST = ForwardedRequest("POST", "/v1/completions", b"", [], b"{}")


def _app(pause_s: float | None):
    async def app(scope, receive, send):
        assert (await receive())["body"] == b"{}"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
        for chunk in (b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if pause_s is not None:
                await asyncio.sleep(pause_s)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    return app


async def _collect(app) -> list:
    return [item async for item in run_asgi_request(app, REQUEST)]


def test_waiting_chunks_are_sent_as_one():
    start, *body = asyncio.run(_collect(_app(pause_s=None)))
    assert start == ResponseStart(200, [(b"a", b"b")])
    assert body == [b"data: 1\n\ndata: 2\n\ndata: 3\n\ndata: [DONE]\n\n"]


def test_chunks_sent_apart_are_not_held_back():
    start, *body = asyncio.run(_collect(_app(pause_s=0.05)))
    assert isinstance(start, ResponseStart)
    assert body == [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n", b"data: [DONE]\n\n"]
