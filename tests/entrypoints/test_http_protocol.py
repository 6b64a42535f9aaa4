"""The request deadline on both of uvicorn's HTTP protocols (h11, and httptools, which `ladle
serve` and the replicas' front pick when installed): a request must arrive whole within the
deadline, else 408 and the connection closes; a request that arrived is answered, and a response
that takes longer than the deadline is never cut; with httptools, a request head over 64 KiB is
refused."""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvicorn

from ladle.entrypoints.openai.http_protocol import (
    make_timed_httptools_protocol,
    make_timed_protocol,
)

DEADLINE_S = 0.4


async def _slow_app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for _ in range(3):  # longer than the deadline in all
        await asyncio.sleep(DEADLINE_S / 2)
        await send({"type": "http.response.body", "body": b"tick\n", "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def _protocols() -> list:
    protocols = [pytest.param(make_timed_protocol, id="h11")]
    try:
        import httptools  # noqa: F401

        protocols.append(pytest.param(make_timed_httptools_protocol, id="httptools"))
    except ImportError:
        pass
    return protocols


async def _exchange(make_protocol, sends: list[bytes | float]) -> bytes:
    """Serves _slow_app with the protocol, sends the bytes (a float: a pause) on one connection,
    and returns what came back before the server closed it (or 3 s passed)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        _slow_app, http=make_protocol(DEADLINE_S), lifespan="off", log_level="warning"
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        for item in sends:
            if isinstance(item, float):
                await asyncio.sleep(item)
            else:
                writer.write(item)
        received = b""
        try:
            async with asyncio.timeout(3):
                while chunk := await reader.read(65536):
                    received += chunk
                    if received.endswith(b"0\r\n\r\n"):
                        break  # a whole chunked response: the connection stays open
        except TimeoutError:
            pass
        writer.close()
        return received
    finally:
        server.should_exit = True
        await serving


REQUEST_HEAD = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n\r\n"


@pytest.mark.parametrize("make_protocol", _protocols())
@pytest.mark.parametrize(
    "sends",
    [
        pytest.param([], id="silent"),
        pytest.param([b"POST / HT", DEADLINE_S * 2], id="trickled-headers"),
        pytest.param([REQUEST_HEAD + b"ab", DEADLINE_S * 2], id="body-never-completes"),
    ],
)
def test_a_request_that_does_not_arrive_in_time_gets_408(make_protocol, sends):
    received = asyncio.run(_exchange(make_protocol, sends))
    assert received.startswith(b"HTTP/1.1 408"), received
    assert b"request_timeout" in received


@pytest.mark.parametrize("make_protocol", _protocols())
def test_a_whole_request_is_answered_past_the_deadline(make_protocol):
    received = asyncio.run(_exchange(make_protocol, [REQUEST_HEAD + b"abcd"]))
    assert received.startswith(b"HTTP/1.1 200"), received
    assert received.count(b"tick") == 3 and received.endswith(b"0\r\n\r\n")


def test_a_request_head_over_64_kib_is_refused_with_httptools():
    pytest.importorskip("httptools")
    head = b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\n"
    huge = head + b"x-big: " + b"a" * (80 * 1024) + b"\r\n\r\nabcd"
    received = asyncio.run(_exchange(make_timed_httptools_protocol, [huge]))
    assert received.startswith(b"HTTP/1.1 400"), received[:80]
    # Under the bound is fine.
    fine = head + b"x-big: " + b"a" * (60 * 1024) + b"\r\n\r\nabcd"
    received = asyncio.run(_exchange(make_timed_httptools_protocol, [fine]))
    assert received.startswith(b"HTTP/1.1 200"), received[:80]
