"""LadleReplica: one ladle engine (its own engine-core process) and ladle's FastAPI app, as the
body of a Ray Serve deployment. The ingress (ingress.py) forwards HTTP requests to it.

Ray restarts a replica whose check_health raises: it does once the engine-core process died.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from ladle.entrypoints.cluster.asgi_forwarding import (
    ForwardedRequest,
    ResponseStart,
    run_asgi_request,
)


class LadleReplica:
    """Ray Serve deployment body; built by build_app (app.py) with the same options as
    `ladle serve` (engine_options are EngineConfig's keyword arguments)."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits an async constructor
        self,
        engine_options: dict[str, Any],
        served_model_name: str,
        api_key: str | None,
        max_request_bytes: int,
        max_queued_requests: int,
        max_queued_tokens: int,
        allow_unknown_fields: bool = False,
    ) -> None:
        from ladle.config import EngineConfig
        from ladle.engine.admission import AdmissionController
        from ladle.engine.client import AsyncEngineClient
        from ladle.engine.restart_policy import RestartPolicy
        from ladle.entrypoints.openai.server import ServerSettings, build_app
        from ladle.metrics import ServerMetrics

        EngineConfig.from_kwargs(**engine_options)  # bad options fail here, with the field named
        metrics = ServerMetrics(served_model_name)
        admission = AdmissionController(max_queued_requests, max_queued_tokens)
        # Ray replaces a replica whose engine died (check_health); an engine restart inside the
        # replica would answer 503s meanwhile instead of letting the ingress retry elsewhere.
        self._client = AsyncEngineClient(
            engine_options, metrics, admission, restart_policy=RestartPolicy(enabled=False)
        )
        settings = ServerSettings(
            served_model_name, api_key or None, max_request_bytes, allow_unknown_fields
        )
        self._app = build_app(self._client, settings)
        # Ray runs an async constructor on the event loop that later serves the requests, which
        # the engine client's sockets belong to. The replica counts as running only once its
        # engine is ready, so `serve.run` returning means every engine is up; a model that fails
        # to load fails the deployment with the engine's message.
        lifespan = self._app.router.lifespan_context(self._app)
        await lifespan.__aenter__()
        self._lifespan: contextlib.AbstractAsyncContextManager | None = lifespan

    async def engine_pid(self) -> int:
        """The engine-core process id of the replica that answers (used by fault tests)."""
        return self._client.engine_pid or 0

    async def forward(
        self, request: ForwardedRequest, routing_key: int | None = None
    ) -> AsyncIterator[Any]:
        """Runs one HTTP request through ladle's app; routing_key is the router's (unused here).

        With a dead engine it raises before answering, so the ingress retries elsewhere instead
        of relaying this replica's 503 (check_health has Ray replace it meanwhile)."""
        if not self._client.is_alive:
            raise RuntimeError(f"engine core is gone: {self._client.dead_reason}")
        async for item in run_asgi_request(self._app, request):
            if isinstance(item, ResponseStart) and item.status >= 500 and not self._client.is_alive:
                # The engine died under this request before anything reached the client: fail
                # the call, so that the ingress retries it on another replica.
                raise RuntimeError(f"engine core died: {self._client.dead_reason}")
            yield item

    async def check_health(self) -> None:
        """Ray calls this periodically; raising makes Ray replace the replica."""
        if self._lifespan is not None and not self._client.is_alive:
            raise RuntimeError(f"engine core is gone: {self._client.dead_reason}")

    async def __del__(self) -> None:
        lifespan = getattr(self, "_lifespan", None)  # None when the constructor failed
        if lifespan is not None:
            self._lifespan = None
            await lifespan.__aexit__(None, None, None)
