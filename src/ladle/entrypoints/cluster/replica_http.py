"""A replica's own HTTP server: ladle's app under uvicorn, inside the Ray replica's process and
event loop, so the front (front.py) streams a response's bytes straight from the engine's API
server. Ray carries only the per-request slot call that picks the replica (request_router.py);
no token crosses Ray.

The server binds a port of its own choosing (port 0) on the given host and reports the address
the front connects to. It installs no signal handlers: the replica's process belongs to Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import uuid
from typing import Any

import uvicorn

# Set on a 5xx answered while the replica's engine is dead: the front retries the request on
# another replica (nothing reached the client yet) instead of relaying this replica's 503.
ENGINE_DEAD_HEADER = "x-ladle-engine-dead"
# The slot a request belongs to (ReplicaSlot.slot_id): the replica ends that slot call when the
# request's HTTP exchange ends, so Ray counts the request until its last byte left the replica.
SLOT_HEADER = "x-ladle-slot"
# A slot whose HTTP request has not arrived by then ends anyway (its front is gone).
UNCLAIMED_SLOT_S = 60.0
# Longer than the front's pooled-connection idle time (front.py), so the replica never closes a
# kept-alive connection the front is about to reuse.
KEEP_ALIVE_S = 120


@dataclasses.dataclass(frozen=True)
class ReplicaSlot:
    """What the slot call answers: where to send the request, and who will answer it."""

    replica_id: str
    base_url: str  # http://host:port, no trailing slash
    slot_id: str = ""  # sent back as SLOT_HEADER on the HTTP request


@dataclasses.dataclass
class _Slot:
    claimed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    done: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


class SlotTable:
    """The replica's open slots. A slot call opens one, and waits until the HTTP request that
    names it (SLOT_HEADER) has ended, then ends normally: no cancellation, so Ray's accounting of
    the call ends as soon as the replica is done with the request."""

    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def open(self) -> str:
        slot_id = uuid.uuid4().hex
        self._slots[slot_id] = _Slot()
        return slot_id

    async def wait_until_done(self, slot_id: str, unclaimed_s: float = UNCLAIMED_SLOT_S) -> None:
        """Returns when the slot's request has ended, or when none claimed it in unclaimed_s;
        forgets the slot either way (also when cancelled)."""
        slot = self._slots[slot_id]
        try:
            try:
                await asyncio.wait_for(slot.claimed.wait(), timeout=unclaimed_s)
            except TimeoutError:
                return
            await slot.done.wait()
        finally:
            self._slots.pop(slot_id, None)

    def claim(self, slot_id: str) -> None:
        if (slot := self._slots.get(slot_id)) is not None:
            slot.claimed.set()

    def finish(self, slot_id: str) -> None:
        if (slot := self._slots.get(slot_id)) is not None:
            slot.done.set()


def end_slots(app: Any, slots: SlotTable) -> Any:
    """ASGI middleware: a request naming a slot claims it, and finishes it once the app is done
    with the request (answered, failed, or the client left)."""
    header = SLOT_HEADER.encode()

    async def ending(scope: dict, receive: Any, send: Any) -> None:
        slot_id = None
        if scope["type"] == "http":
            for name, value in scope["headers"]:
                if name == header:
                    slot_id = value.decode("latin-1")
                    slots.claim(slot_id)
                    break
        try:
            await app(scope, receive, send)
        finally:
            if slot_id is not None:
                slots.finish(slot_id)

    return ending


def mark_engine_death(app: Any, is_alive: Any) -> Any:
    """ASGI middleware: adds ENGINE_DEAD_HEADER to a 5xx response start when is_alive() is false."""

    async def marked(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_marked(message: dict) -> None:
            if (
                message["type"] == "http.response.start"
                and message["status"] >= 500
                and not is_alive()
            ):
                headers = [*message.get("headers", []), (ENGINE_DEAD_HEADER.encode(), b"1")]
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive, send_marked)

    return marked


class _QuietServer(uvicorn.Server):
    """uvicorn without its signal handlers (Ray owns the process's signals)."""

    def capture_signals(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


class ReplicaHttpServer:
    """ladle's app served on host:<free port> on the running event loop."""

    def __init__(self, app: Any, host: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, 0))
        port = self._socket.getsockname()[1]
        shown = f"[{host}]" if ":" in host else host
        self.base_url = f"http://{shown}:{port}"
        config = uvicorn.Config(
            app,
            lifespan="off",  # the replica runs the app's lifespan itself (replica.py)
            log_level="warning",
            access_log=False,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=5,
        )
        self._server = _QuietServer(config)
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():  # failed to start: raise its error
                self._task.result()
                raise RuntimeError("the replica's HTTP server stopped before it started")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(self._task, timeout=10)
        except (TimeoutError, asyncio.CancelledError):
            self._task.cancel()
        finally:
            self._socket.close()
