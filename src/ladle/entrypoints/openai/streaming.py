"""Client disconnects, for streaming and non-streaming responses, and server-sent events.

A request whose client has gone must be aborted in the engine at once, wherever it is: waiting
in the queue (no bytes are being written, so no write can fail), prefilling or decoding. So both
response paths race the work against the ASGI `http.disconnect` message and cancel the work when
the client leaves; cancelling closes the request's RequestStream, which aborts it in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import anyio
from fastapi import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ladle.frontend.client import RequestStream
from ladle.outputs import RequestOutput

T = TypeVar("T")
SSE_DONE = "data: [DONE]\n\n"


def sse_event(json_text: str) -> str:
    return f"data: {json_text}\n\n"


class ClientDisconnected(Exception):
    """The client closed the connection before the response was complete."""


async def _wait_for_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def run_until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await work, cancelling it if the client disconnects first (then ClientDisconnected).

    Call once the body has been read: every later ASGI message is then a disconnect.
    """
    work_task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request.receive))
    try:
        await asyncio.wait({work_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work_task.done():
            work_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work_task
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    if work_task.cancelled():
        raise ClientDisconnected()
    return work_task.result()


class DisconnectAwareStreamingResponse(StreamingResponse):
    """A StreamingResponse that always listens for the disconnect while it streams.

    Starlette does so only for ASGI servers below spec 2.4 (uvicorn reports 2.3 today); with
    newer ones it notices a gone client only when a write fails, which never happens while a
    request waits in the queue.
    The body iterator is closed on every exit, and on_close runs, even when the client left
    before the body was first read (an async generator never started skips its `finally`).
    """

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None], **kwargs) -> None:
        super().__init__(content, media_type="text/event-stream", **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as task_group:

                async def stream_then_stop() -> None:
                    with contextlib.suppress(OSError):  # the client went away mid-write
                        await self.stream_response(send)
                    task_group.cancel_scope.cancel()

                task_group.start_soon(stream_then_stop)
                await _wait_for_disconnect(receive)
                task_group.cancel_scope.cancel()
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            self.on_close()


async def merge_streams(
    streams: list[RequestStream],
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream index, output) from several request streams as they arrive; the first error
    from any stream is raised. The caller closes the streams."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                queue.put_nowait((index, output))
        except Exception as error:  # noqa: BLE001 - handed to the consumer, which raises it
            queue.put_nowait((index, error))
        queue.put_nowait((index, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        num_open = len(streams)
        while num_open:
            index, item = await queue.get()
            if item is None:
                num_open -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
