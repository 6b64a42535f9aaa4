"""LadleReplica: one ladle engine (its own engine-core process) and ladle's FastAPI app, as the
body of a Ray Serve deployment. The ingress (ingress.py) forwards HTTP requests to it.

Ray restarts a replica whose check_health raises: it does once the engine-core process died.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from ladle.entrypoints.cluster.asgi_forwarding import (
    ForwardedRequest,
    ResponseStart,
    run_asgi_request,
)
from ladle.entrypoints.cluster.replica_settings import ReplicaServerSettings


class LadleReplica:
    """Ray Serve deployment body; built by build_app (app.py) with the same options as
    `ladle serve` (engine_options are EngineConfig's keyword arguments)."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits an async constructor
        self, engine_options: dict[str, Any], settings: ReplicaServerSettings
    ) -> None:
        from ladle.config import EngineConfig
        from ladle.engine.admission import AdmissionController
        from ladle.engine.client import AsyncEngineClient
        from ladle.engine.restart_policy import RestartPolicy
        from ladle.entrypoints.openai.live_stats import LiveStatsLogger
        from ladle.entrypoints.openai.request_log import enable_request_logging
        from ladle.entrypoints.openai.server import ServerSettings, build_app
        from ladle.metrics import ServerMetrics

        EngineConfig.from_kwargs(**engine_options)  # bad options fail here, with the field named
        from ray import serve

        self._replica_id = serve.get_replica_context().replica_id.unique_id
        metrics = ServerMetrics(settings.served_model_name)
        admission = AdmissionController(settings.max_queued_requests, settings.max_queued_tokens)
        if settings.ttft_slo_s is not None:
            from ladle.engine.slo_admission import TtftSloAdmission

            admission = TtftSloAdmission(admission, settings.ttft_slo_s, lambda: client.stats)
        # Ray replaces a replica whose engine died (check_health); an engine restart inside the
        # replica would answer 503s meanwhile instead of letting the ingress retry elsewhere.
        client = AsyncEngineClient(
            engine_options, metrics, admission, restart_policy=RestartPolicy(enabled=False)
        )
        self._client = client
        server_settings = ServerSettings(
            served_model_name=settings.served_model_name,
            api_key=settings.api_key or None,
            max_request_bytes=settings.max_request_bytes,
            allow_unknown_fields=settings.allow_unknown_fields,
            log_requests=settings.log_requests,
            tool_call_parser=settings.tool_call_parser,
            reasoning_parser=settings.reasoning_parser,
        )
        if settings.log_requests:
            enable_request_logging()
        live_stats = LiveStatsLogger(lambda: client.stats, settings.stats_interval_s or 5.0)
        self._app = build_app(client, server_settings, on_refusal=live_stats.record_refusal)
        # Ray runs an async constructor on the event loop that later serves the requests, which
        # the engine client's sockets belong to. The replica counts as running only once its
        # engine is ready, so `serve.run` returning means every engine is up; a model that fails
        # to load fails the deployment with the engine's message.
        lifespan = self._app.router.lifespan_context(self._app)
        await lifespan.__aenter__()
        self._lifespan: contextlib.AbstractAsyncContextManager | None = lifespan
        self._stats_task = (
            asyncio.create_task(live_stats.run()) if settings.stats_interval_s > 0 else None
        )

    async def metrics_text(self) -> tuple[str, bytes]:
        """(this replica's id, its engine metrics in Prometheus text): the ingress labels and
        merges them into the endpoint's /metrics."""
        return self._replica_id, self._client.metrics.render()

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
            if isinstance(item, ResponseStart):
                if item.status >= 500 and not self._client.is_alive:
                    # The engine died under this request before anything reached the client:
                    # fail the call, so that the ingress retries it on another replica.
                    raise RuntimeError(f"engine core died: {self._client.dead_reason}")
                item = dataclasses.replace(item, replica_id=self._replica_id)
            yield item

    async def check_health(self) -> None:
        """Ray calls this periodically; raising makes Ray replace the replica."""
        if self._lifespan is not None and not self._client.is_alive:
            raise RuntimeError(f"engine core is gone: {self._client.dead_reason}")

    async def __del__(self) -> None:
        stats_task = getattr(self, "_stats_task", None)
        if stats_task is not None:
            stats_task.cancel()
        lifespan = getattr(self, "_lifespan", None)  # None when the constructor failed
        if lifespan is not None:
            self._lifespan = None
            await lifespan.__aexit__(None, None, None)
