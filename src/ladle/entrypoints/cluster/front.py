"""ReplicaFront: the endpoint's logic in front of the engine replicas, off the token path.

Per request it computes the prompt's prefix key, asks Ray for a replica (the `open_slot` call,
routed by the prefix-aware router, held open for the request's life so Ray counts it), then sends
the HTTP request to that replica's own server and relays the response bytes as they arrive:
whatever the replica has written since the last read goes out as one piece, so under load the
relay coalesces by itself and costs one read and one write per piece, not a Ray call per token.

It answers itself:

    GET /health    200 {"status": "ok"} when all asked-for replicas run, 200 "degraded" when
                   some do, 503 when none does
    GET /metrics   the router's counters (routing_metrics.py; summed over the front processes
                   when there are several), then every replica's own engine metrics labelled
                   replica="<id>" (replica_metrics.py)

Faults: a request whose replica fails before answering (its slot call or its connection fails,
or it answers a 5xx with a dead engine) is sent again to another replica, up to `max_attempts`
in all, backing off; a stream cut after it began ends with an OpenAI error event and
`data: [DONE]`, so no client waits forever.

Used twice: run in the `ladle serve --replicas N` process itself (front_server.py; and in each
of its --api-server-count front processes, front_processes.py), and inside the LadleIngress
deployment behind Ray Serve's proxy for `serve run` users (ingress.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from ray import serve
from ray.exceptions import RayError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

# Through the module (which pickles by name), never its counters: see request_router.py.
from ladle.entrypoints.cluster import routing_metrics
from ladle.entrypoints.cluster.replica_http import ENGINE_DEAD_HEADER, SLOT_HEADER, ReplicaSlot
from ladle.entrypoints.cluster.replica_metrics import merge_replica_metrics
from ladle.entrypoints.cluster.request_router import ROUTING_KEY_KWARG
from ladle.entrypoints.cluster.routing_keys import request_routing_key
from ladle.model.tokenizer import load_tokenizer

logger = logging.getLogger("ladle.cluster")

ENGINE_DEPLOYMENT_NAME = "LadleReplica"

# Hop-by-hop headers (RFC 9110 7.6.1) and the framing each side computes for itself.
_HOP_HEADERS = {
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "host",
    SLOT_HEADER,  # the front's own, to the replica; never a client's
}
_SLOT_FAILURES = (RayError, ConnectionError, RuntimeError)
# Replicas that do not answer their metrics call within this are left out of that scrape.
_REPLICA_METRICS_TIMEOUT_S = 5.0
# Pooled connections to replicas idle this long are closed (below the replicas' keep-alive).
_POOL_IDLE_S = 60.0
# How long a finished response waits for Ray to confirm its slot call ended (normally ~1 ms).
_SLOT_END_WAIT_S = 2.0


@dataclasses.dataclass(frozen=True)
class FrontSettings:
    """What the front needs besides the replicas' handle; plain data (Ray pickles it)."""

    tokenizer_path: str | None  # the replicas' tokenizer (app.routing_tokenizer_source)
    block_size: int
    num_prefix_blocks: int
    num_replicas_asked: int
    max_attempts: int = 6
    retry_backoff_s: float = 0.5  # before the second attempt; doubled before each next one


def _error(status: int, message: str, code: str) -> JSONResponse:
    error_type = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse(
        {"error": {"message": message, "type": error_type, "param": None, "code": code}},
        status_code=status,
    )


def _cut_stream_event(error: BaseException) -> bytes:
    message = f"the replica serving this stream failed: {type(error).__name__}"
    error_body = {"message": message, "type": "server_error", "code": "replica_failed"}
    event = {"error": {**error_body, "param": None}}
    return f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()


def num_running_replicas(app_name: str) -> int:
    """LadleReplica replicas of application `app_name` that Ray Serve reports RUNNING (blocks)."""
    status = serve.status().applications.get(app_name)
    if status is None:
        return 0
    deployment = status.deployments.get(ENGINE_DEPLOYMENT_NAME)
    return 0 if deployment is None else int(deployment.replica_states.get("RUNNING", 0))


def _load_tokenizer_or_none(path: str | None) -> Any:
    """The front tokenizes only to pick a replica; without a tokenizer every request is keyed
    None and goes to the least loaded replica."""
    if path is None:
        return None

    try:
        return load_tokenizer(path)
    except Exception as error:  # noqa: BLE001 - a tokenizer folder that does not load
        logger.warning("no tokenizer for prefix routing (%s); routing by load only", error)
        return None


async def _own_routing_metrics() -> bytes:
    return routing_metrics.render_routing_metrics()


class ReplicaFront:
    """engine: a DeploymentHandle to the LadleReplica deployment; num_running_replicas: a
    blocking function answering how many of them run now (Ray's status); routing_metrics_text:
    the router counters /metrics shows (default: this process's; with several front processes,
    their sum: front_peers.py)."""

    def __init__(
        self,
        engine: Any,
        settings: FrontSettings,
        num_running_replicas: Callable[[], int],
        routing_metrics_text: Callable[[], Awaitable[bytes]] = _own_routing_metrics,
    ) -> None:
        if settings.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {settings.max_attempts}")
        if settings.retry_backoff_s < 0:
            raise ValueError(f"retry_backoff_s must be >= 0, got {settings.retry_backoff_s}")
        self._engine = engine
        self._slots = engine.options(stream=True)  # made once: options() builds a new handle
        self._settings = settings
        self._num_running_replicas = num_running_replicas
        self._routing_metrics_text = routing_metrics_text
        self._tokenizer = _load_tokenizer_or_none(settings.tokenizer_path)
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        # Made on first use, inside the serving event loop that it belongs to.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=_POOL_IDLE_S),
                timeout=aiohttp.ClientTimeout(total=None, connect=10),
                auto_decompress=False,  # relay the bytes as the replica sent them
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def health(self) -> Response:
        num_running = await asyncio.to_thread(self._num_running_replicas)
        asked = self._settings.num_replicas_asked
        body = {"replicas_running": num_running, "replicas_asked": asked}
        if num_running == 0:
            return JSONResponse({"status": "unavailable", **body}, status_code=503)
        status = "ok" if num_running >= asked else "degraded"
        return JSONResponse({"status": status, **body})

    async def metrics(self) -> Response:
        routing_text, texts = await asyncio.gather(
            self._routing_metrics_text(), self._replica_metrics()
        )
        return Response(
            routing_text + merge_replica_metrics(texts),
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

    async def forward(self, request: Request) -> Response:
        body = await request.body()
        key = None
        if request.method == "POST":
            settings = self._settings
            key = await asyncio.to_thread(
                request_routing_key,
                request.url.path,
                body,
                self._tokenizer,
                settings.block_size,
                settings.num_prefix_blocks,
            )
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = [
            (name, value)
            for name, value in request.headers.items()
            if name.lower() not in _HOP_HEADERS
        ]
        max_attempts = self._settings.max_attempts
        for attempt in range(1, max_attempts + 1):
            # A retry drops the prefix key: affinity would send it back to the failed replica.
            slot_call = self._slots.open_slot.remote(
                **{ROUTING_KEY_KWARG: key if attempt == 1 else None}
            )
            upstream = None
            try:
                slot: ReplicaSlot = await slot_call.__anext__()
                upstream = await self._http().request(
                    request.method,
                    slot.base_url + path,
                    headers=[*headers, (SLOT_HEADER, slot.slot_id)],
                    data=body,
                )
                if upstream.status >= 500 and ENGINE_DEAD_HEADER in upstream.headers:
                    raise ConnectionError(f"replica {slot.replica_id}: its engine died")
            except (*_SLOT_FAILURES, aiohttp.ClientError, StopAsyncIteration) as error:
                if upstream is not None:
                    upstream.release()
                slot_call.cancel()
                if attempt == max_attempts:
                    return _error(503, f"no replica could answer: {error}", "replica_unavailable")
                routing_metrics.RETRIED_REQUESTS.inc()
                logger.warning("replica failed before answering (%s); retrying", error)
                # Back off past Ray's health check period (2 s), by which time a replica with a
                # dead engine has left the candidates: 0.5 + 1 + 2 + 4 + 8 s over six attempts.
                await asyncio.sleep(self._settings.retry_backoff_s * 2 ** (attempt - 1))
                continue
            except BaseException:
                if upstream is not None:
                    upstream.release()
                slot_call.cancel()
                raise
            routing_metrics.ROUTED_REQUESTS.labels(replica=slot.replica_id).inc()
            response_headers = {
                name: value
                for name, value in upstream.headers.items()
                if name.lower() not in _HOP_HEADERS
            }
            is_event_stream = upstream.content_type == "text/event-stream"
            return RelayResponse(
                _relay(upstream, slot_call, is_event_stream),
                status_code=upstream.status,
                headers=response_headers,
            )
        raise AssertionError("unreachable")


class RelayResponse(StreamingResponse):
    """The replica's response body sent on as it arrives: one ASGI send per piece, with no
    per-request task group (Starlette's streaming response runs one, for its disconnect
    watcher, on servers of ASGI spec < 2.4, as uvicorn is). A client that leaves ends the
    relay here too: the connection to the replica closes, so the replica aborts the request."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        relaying = asyncio.current_task()
        state = {"finished": False, "client_left": False}

        def on_client_gone(watched: asyncio.Future) -> None:
            if not watched.cancelled():
                watched.exception()  # retrieved: a receive that failed counts as the client gone
            if not state["finished"] and relaying is not None:
                state["client_left"] = True
                relaying.cancel()

        watcher = asyncio.ensure_future(_until_disconnect(receive))
        watcher.add_done_callback(on_client_gone)
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            state["finished"] = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not state["client_left"] or relaying is None:
                raise
            relaying.uncancel()  # the cancellation was ours: the client left
        finally:
            state["finished"] = True
            watcher.cancel()
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


async def _until_disconnect(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _relay(
    upstream: aiohttp.ClientResponse, slot_call: Any, is_event_stream: bool
) -> AsyncIterator[bytes]:
    """The replica's response body as it arrives; the connection goes back to the pool (or is
    closed, when the client left early, which the replica's app sees as a disconnect and aborts
    the request) and the slot call ends with it."""
    slot_ended = False
    try:
        while chunk := await upstream.content.readany():
            yield chunk
        upstream.release()
        # The response ends only once Ray has the slot back (the replica ends it when it is done
        # with the request): a client that sends its next request on seeing this one end finds
        # this replica's in-flight count already lowered (else sequential requests would see a
        # phantom load and spread for no reason).
        slot_ended = await _slot_ended(slot_call)
    except (aiohttp.ClientError, ConnectionError) as error:
        routing_metrics.CUT_STREAMS.inc()
        logger.warning("replica failed mid-response: %s", error)
        if is_event_stream:
            yield _cut_stream_event(error)
    finally:
        upstream.close()  # a no-op once released
        if not slot_ended:
            slot_call.cancel()


async def _slot_ended(slot_call: Any) -> bool:
    """Waits (briefly) for the replica to end the slot call; False if it did not."""
    try:
        await asyncio.wait_for(slot_call.__anext__(), timeout=_SLOT_END_WAIT_S)
    except StopAsyncIteration:
        return True
    except Exception:  # noqa: BLE001 - a slot that failed or lingers: cancelled by the caller
        return False
    return False
