"""LadleReplica: one ladle engine (its own engine-core process) and ladle's FastAPI app served
by the replica's own HTTP server (replica_http.py), as the body of a Ray Serve deployment.

The front (front.py) asks Ray for a replica with `open_slot`: Ray's request router picks one
(prefix-aware, request_router.py), the slot answers that replica's address and stays open while
the front streams the HTTP response straight from it, so Ray's queue counts, back-pressure and
autoscaling see every request in flight while no token crosses Ray.

Ray restarts a replica whose check_health raises: it does once the engine-core process died.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray import serve

from ladle.config import EngineConfig
from ladle.entrypoints.cluster.replica_http import (
    ReplicaHttpServer,
    ReplicaSlot,
    SlotTable,
    end_slots,
    mark_engine_death,
)
from ladle.entrypoints.cluster.replica_settings import ReplicaServerSettings
from ladle.entrypoints.openai.live_stats import LiveStatsLogger
from ladle.entrypoints.openai.request_log import enable_request_logging
from ladle.frontend.admission import AdmissionController
from ladle.frontend.restart_policy import RestartPolicy
from ladle.frontend.slo_admission import TtftSloAdmission


class LadleReplica:
    """Ray Serve deployment body; built by build_app (app.py) with the same options as
    `ladle serve` (engine_options are EngineConfig's keyword arguments)."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits an async constructor
        self, engine_options: dict[str, Any], settings: ReplicaServerSettings
    ) -> None:
        # The server stack (fastapi, zmq, tokenizers, prometheus_client: ~0.35 s) loads in the
        # replica's actor only, not in the driver and front processes that import this class.
        from ladle.entrypoints.openai.server import ServerSettings, build_app
        from ladle.frontend.client import AsyncEngineClient
        from ladle.frontend.metrics import ServerMetrics

        EngineConfig.from_kwargs(**engine_options)  # bad options fail here, with the field named

        self._replica_id = serve.get_replica_context().replica_id.unique_id
        metrics = ServerMetrics(settings.served_model_name)
        admission = AdmissionController(settings.max_queued_requests, settings.max_queued_tokens)
        if settings.ttft_slo_s is not None:
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
            response_role=settings.response_role,
            return_tokens_as_token_ids=settings.return_tokens_as_token_ids,
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
        host = settings.http_host or ray.util.get_node_ip_address()
        self._slots = SlotTable()
        served = end_slots(mark_engine_death(self._app, lambda: client.is_alive), self._slots)
        self._http = ReplicaHttpServer(served, host)
        await self._http.start()
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

    async def open_slot(self, routing_key: int | None = None) -> AsyncIterator[ReplicaSlot]:
        """Answers where to send one HTTP request, then holds until that request has ended here
        (or the front cancels the call): Ray counts the request on this replica all along.
        routing_key is the router's (unused here).

        With a dead engine it raises before answering, so the front tries another replica
        (check_health has Ray replace this one meanwhile)."""
        if not self._client.is_alive:
            raise RuntimeError(f"engine core is gone: {self._client.dead_reason}")
        slot_id = self._slots.open()
        yield ReplicaSlot(self._replica_id, self._http.base_url, slot_id)
        await self._slots.wait_until_done(slot_id)

    async def check_health(self) -> None:
        """Ray calls this periodically; raising makes Ray replace the replica."""
        if self._lifespan is not None and not self._client.is_alive:
            raise RuntimeError(f"engine core is gone: {self._client.dead_reason}")

    async def __del__(self) -> None:
        stats_task = getattr(self, "_stats_task", None)
        if stats_task is not None:
            stats_task.cancel()
        http = getattr(self, "_http", None)
        if http is not None:
            await http.stop()
        lifespan = getattr(self, "_lifespan", None)  # None when the constructor failed
        if lifespan is not None:
            self._lifespan = None
            await lifespan.__aexit__(None, None, None)
