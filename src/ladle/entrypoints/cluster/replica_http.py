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
from typing import Any

import uvicorn

# Set on a 5xx answered while the replica's engine is dead: the front retries the request on
# another replica (nothing reached the client yet) instead of relaying this replica's 503.
ENGINE_DEAD_HEADER = "x-ladle-engine-dead"
# Longer than the front's pooled-connection idle time (front.py), so the replica never closes a
# kept-alive connection the front is about to reuse.
KEEP_ALIVE_S = 120


@dataclasses.dataclass(frozen=True)
class ReplicaSlot:
    """What the slot call answers: where to send the request, and who will answer it."""

    replica_id: str
    base_url: str  # http://host:port, no trailing slash


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
