"""LadleIngress: the one HTTP endpoint in front of the engine replicas.

Every /v1 request is forwarded whole to a replica chosen by the prefix-aware router (the body's
prefix key rides along as `routing_key`); the replica runs it through ladle's own app, so routes,
errors, auth and streaming are `ladle serve`'s. The ingress itself answers:

    GET /health    200 {"status": "ok"} when all asked-for replicas run, 200 "degraded" when
                   some do, 503 when none does
    GET /metrics   the router's counters (routing_metrics.py), then every replica's own engine
                   metrics labelled replica="<id>" (replica_metrics.py)

Faults: a request whose replica fails before its first byte is sent again to another replica (up
to `max_attempts` in all, backing off); a stream cut after it began ends with an OpenAI error
event and `data: [DONE]`, so no client waits forever.
"""

# No `from __future__ import annotations`: FastAPI reads the route methods' annotations at
# runtime, and serve.ingress re-binds them out of this module's namespace.

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import RayActorError, RayError
from ray.serve.handle import DeploymentHandle

# Through the module (which pickles by name), never its counters: see request_router.py.
from ladle.entrypoints.cluster import routing_metrics
from ladle.entrypoints.cluster.asgi_forwarding import ForwardedRequest, ResponseStart
from ladle.entrypoints.cluster.replica_metrics import merge_replica_metrics
from ladle.entrypoints.cluster.request_router import ROUTING_KEY_KWARG
from ladle.entrypoints.cluster.routing_keys import request_routing_key

logger = logging.getLogger("ladle.cluster")

ingress_app = FastAPI(title="ladle", docs_url=None, redoc_url=None, openapi_url=None)

# Headers the replica's app computed for its own framing; the ingress's server sets its own.
_HOP_HEADERS = {b"content-length", b"transfer-encoding", b"connection"}
_REPLICA_FAILURES = (RayActorError, RayError, ConnectionError)
# Replicas that do not answer their metrics call within this are left out of that scrape.
_REPLICA_METRICS_TIMEOUT_S = 5.0

ENGINE_DEPLOYMENT_NAME = "LadleReplica"

# Everything the class below calls is defined above it: serve.ingress builds a new class at
# decoration time, which Ray pickles by value together with the globals it finds then.


async def _relay(stream: Any, is_event_stream: bool) -> AsyncIterator[bytes]:
    try:
        async for chunk in stream:
            yield chunk
    except _REPLICA_FAILURES as error:
        routing_metrics.CUT_STREAMS.inc()
        logger.warning("replica failed mid-stream: %s", error)
        if is_event_stream:
            message = f"the replica serving this stream failed: {type(error).__name__}"
            event = {
                "error": {
                    "message": message,
                    "type": "server_error",
                    "code": "replica_failed",
                    "param": None,
                }
            }
            yield f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()
    finally:
        stream.cancel()  # a client that left: the replica's app sees the disconnect


def _error(status: int, message: str, code: str) -> JSONResponse:
    error_type = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse(
        {"error": {"message": message, "type": error_type, "param": None, "code": code}},
        status_code=status,
    )


def _num_running_replicas() -> int:
    context = serve.get_replica_context()
    status = serve.status().applications.get(context.app_name)
    if status is None:
        return 0
    for name, deployment in status.deployments.items():
        if name == ENGINE_DEPLOYMENT_NAME:
            return int(deployment.replica_states.get("RUNNING", 0))
    return 0


def _load_tokenizer_or_none(model: str | None) -> Any:
    """The ingress tokenizes only to pick a replica; without a tokenizer every request is keyed
    None and goes to the least loaded replica."""
    if model is None:
        return None
    from ladle.engine.tokenizer import load_tokenizer

    try:
        return load_tokenizer(model)
    except Exception as error:  # noqa: BLE001 - e.g. a dummy preset without a tokenizer
        logger.warning("no tokenizer for prefix routing (%s); routing by load only", error)
        return None


@serve.ingress(ingress_app)
class LadleIngress:
    """Ray Serve deployment body of the endpoint; `engine` is the LadleReplica deployment."""

    def __init__(
        self,
        engine: DeploymentHandle,
        model: str | None,
        tokenizer_path: str | None,
        block_size: int,
        num_prefix_blocks: int,
        num_replicas_asked: int,
        max_attempts: int = 6,
    ) -> None:
        self._engine = engine
        self._block_size = block_size
        self._num_prefix_blocks = num_prefix_blocks
        self._num_replicas_asked = num_replicas_asked
        self._max_attempts = max_attempts
        self._tokenizer = _load_tokenizer_or_none(tokenizer_path or model)

    @ingress_app.get("/health")
    async def health(self) -> Response:
        num_running = await asyncio.to_thread(_num_running_replicas)
        body = {"replicas_running": num_running, "replicas_asked": self._num_replicas_asked}
        if num_running == 0:
            return JSONResponse({"status": "unavailable", **body}, status_code=503)
        status = "ok" if num_running >= self._num_replicas_asked else "degraded"
        return JSONResponse({"status": status, **body})

    @ingress_app.get("/metrics")
    async def metrics(self) -> Response:
        texts = await self._replica_metrics()
        return Response(
            routing_metrics.render_routing_metrics() + merge_replica_metrics(texts),
            media_type="text/plain; version=0.0.4",
        )

    async def _replica_metrics(self) -> dict[str, bytes]:
        """{replica id: its engine metrics}, asked of every running replica at once (Ray's
        broadcast: no routing, no queueing behind requests)."""
        try:
            answers = await self._engine.broadcast("metrics_text").results_async(
                timeout_s=_REPLICA_METRICS_TIMEOUT_S, return_exceptions=True
            )
        except TimeoutError:
            logger.warning("replica metrics: no answer within %ss", _REPLICA_METRICS_TIMEOUT_S)
            return {}
        for answer in answers:
            if isinstance(answer, BaseException):
                logger.warning("no metrics from a replica: %s", answer)
        return dict(answer for answer in answers if not isinstance(answer, BaseException))

    @ingress_app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
    async def forward(self, request: Request, path: str) -> Response:
        body = await request.body()
        forwarded = ForwardedRequest(
            method=request.method,
            path=request.url.path,
            query_string=request.url.query.encode(),
            headers=list(request.headers.raw),
            body=body,
        )
        key = None
        if request.method == "POST":
            key = await asyncio.to_thread(
                request_routing_key,
                request.url.path,
                body,
                self._tokenizer,
                self._block_size,
                self._num_prefix_blocks,
            )
        for attempt in range(1, self._max_attempts + 1):
            # A retry drops the prefix key: affinity would send it back to the failed replica.
            stream = self._engine.options(stream=True).forward.remote(
                forwarded, **{ROUTING_KEY_KWARG: key if attempt == 1 else None}
            )
            try:
                start = await stream.__anext__()
            except _REPLICA_FAILURES as error:
                stream.cancel()
                if attempt == self._max_attempts:
                    return _error(503, f"no replica could answer: {error}", "replica_unavailable")
                routing_metrics.RETRIED_REQUESTS.inc()
                logger.warning("replica failed before answering (%s); retrying", error)
                # Back off past Ray's health check period (2 s), by which time a replica with a
                # dead engine has left the candidates: 0.5 + 1 + 2 + 4 + 8 s over six attempts.
                await asyncio.sleep(0.5 * 2 ** (attempt - 1))
                continue
            except StopAsyncIteration:
                return _error(500, "the replica sent no response", "internal_error")
            assert isinstance(start, ResponseStart)
            routing_metrics.ROUTED_REQUESTS.labels(replica=start.replica_id).inc()
            headers = {
                name.decode("latin-1"): value.decode("latin-1")
                for name, value in start.headers
                if name.lower() not in _HOP_HEADERS
            }
            is_event_stream = headers.get("content-type", "").startswith("text/event-stream")
            return StreamingResponse(
                _relay(stream, is_event_stream), status_code=start.status, headers=headers
            )
        raise AssertionError("unreachable")
