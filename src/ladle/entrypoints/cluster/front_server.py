"""The endpoint of `ladle serve --replicas N`: ReplicaFront (front.py) under uvicorn in the
`ladle serve` process itself, so a response's bytes go replica -> this process -> client with
no Ray hop per token (Ray Serve's own proxy would add one: proxy <-> ingress replica). With
`--api-server-count K` the same server runs in K processes on one listening socket
(front_processes.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ladle.entrypoints.cluster.front import ReplicaFront

if TYPE_CHECKING:
    from ladle.entrypoints.cluster.front_peers import FrontPeers


class FrontWorkers(Protocol):
    """The other front processes this one supervises (front_processes.FrontWorkers)."""

    async def wait_serving(self) -> None: ...

    def restart_dead(self) -> None: ...

    def stop(self) -> None: ...

    def wait_stopped(self) -> None: ...

_FORWARDED_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]
_ANSWERED_PATHS = ("/health", "/metrics")


def build_front_app(front: ReplicaFront) -> Any:
    """GET /health and /metrics answered here, everything else forwarded to a replica.

    A forwarded request goes straight to the front, past Starlette's routing and middleware,
    whose wrappers would otherwise run for every relayed piece of every stream."""

    async def health(request: Request) -> Response:
        return await front.health()

    async def metrics(request: Request) -> Response:
        return await front.metrics()

    async def forward(request: Request) -> Response:
        return await front.forward(request)

    answered_here = Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            # What reaches this route is HEAD (Starlette adds it to GET's): forwarded as well.
            Route("/{path:path}", forward, methods=_FORWARDED_METHODS),
        ],
        lifespan=lambda app: _closing(front),
    )

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in _FORWARDED_METHODS
            and not (scope["method"] == "GET" and scope["path"] in _ANSWERED_PATHS)
        ):
            response = await front.forward(Request(scope, receive))
            await response(scope, receive, send)
            return
        await answered_here(scope, receive, send)

    return app


@contextlib.asynccontextmanager
async def _closing(front: ReplicaFront) -> AsyncIterator[None]:
    yield
    await front.close()


def bind_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """The listening socket, bound now so port 0 names its real port before serving starts.

    reuse_port: SO_REUSEPORT, so that the other front processes bind the same port with sockets
    of their own and the kernel spreads new connections over them by a hash of each connection's
    addresses (Linux). One socket shared by all would not spread them: every process is woken
    for a connection and the first to run takes it, with all others queued behind it (asyncio
    accepts in a loop), so one process got 55-70% of a burst of connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind((host, port))
    return listener


class FrontServer(uvicorn.Server):
    """uvicorn serving the front; on_started() runs once it listens (the ready line).

    peers: this process's place among several front processes (its counters served to them);
    workers: the other front processes, when this is the first one: it waits until they serve
    before on_started, restarts any that dies, and stops them when it stops;
    parent_pid: in another front process, the first one's pid: this one stops when it is gone.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        on_started: Callable[[], None],
        peers: FrontPeers | None = None,
        workers: FrontWorkers | None = None,
        parent_pid: int | None = None,
    ) -> None:
        super().__init__(config)
        self._on_started = on_started
        self._peers = peers
        self._workers = workers
        self._parent_pid = parent_pid
        self._watch: asyncio.Task | None = None
        self.start_failed = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started or self.should_exit:
            return
        if self._peers is not None:
            await self._peers.start()
        if self._workers is not None:
            try:
                await self._workers.wait_serving()
            except RuntimeError as error:
                print(f"ladle: error: {error}", file=sys.stderr, flush=True)
                self.start_failed = True
                self.should_exit = True
                return
        if self._workers is not None or self._parent_pid is not None:
            self._watch = asyncio.create_task(self._watch_processes())
        self._on_started()

    async def _watch_processes(self) -> None:
        while not self.should_exit:
            await asyncio.sleep(1.0)
            if self._workers is not None:
                self._workers.restart_dead()
            if self._parent_pid is not None and os.getppid() != self._parent_pid:
                self.should_exit = True  # the first front process is gone: so is the endpoint

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._watch is not None:
            self._watch.cancel()
        if self._workers is not None:
            self._workers.stop()  # they drain their own requests meanwhile
        await super().shutdown(sockets)
        if self._workers is not None:
            await asyncio.to_thread(self._workers.wait_stopped)
        if self._peers is not None:
            await self._peers.close()
