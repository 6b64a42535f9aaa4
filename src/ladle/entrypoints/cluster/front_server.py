"""The endpoint of `ladle serve --replicas N`: ReplicaFront (front.py) under uvicorn in the
`ladle serve` process itself, so a response's bytes go replica -> this process -> client with
no Ray hop per token (Ray Serve's own proxy would add one: proxy <-> ingress replica).
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Callable

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ladle.entrypoints.cluster.front import ReplicaFront

_FORWARDED_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH"]


def build_front_app(front: ReplicaFront) -> Starlette:
    """GET /health and /metrics answered here, everything else forwarded to a replica."""

    async def health(request: Request) -> Response:
        return await front.health()

    async def metrics(request: Request) -> Response:
        return await front.metrics()

    async def forward(request: Request) -> Response:
        return await front.forward(request)

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/{path:path}", forward, methods=_FORWARDED_METHODS),
        ],
        lifespan=lambda app: _closing(front),
    )


@contextlib.asynccontextmanager
async def _closing(front: ReplicaFront) -> AsyncIterator[None]:
    yield
    await front.close()


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound now so port 0 names its real port before serving starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    return listener


class FrontServer(uvicorn.Server):
    """uvicorn serving the front; on_started() runs once it listens (the ready line)."""

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_started = on_started

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and not self.should_exit:
            self._on_started()
