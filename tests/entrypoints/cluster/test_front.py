"""ReplicaFront without a Ray cluster: replicas are small HTTP servers on loopback (a good one, a
cut stream, a dead engine, a closed port) and Ray's slot call is a stand-in handing out their
addresses in turn. Checks the relayed bytes against what the replica sent, the retries of
requests not yet answered (the first attempt keyed, retries not), the error event that ends a
cut stream, the routing counters, the slot calls ended, and /health's three states."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'ladle[ray]')")
pytest.importorskip("aiohttp", reason="aiohttp comes with Ray Serve")

from ladle.entrypoints.cluster import routing_metrics  # noqa: E402
from ladle.entrypoints.cluster.front import FrontSettings, ReplicaFront  # noqa: E402
from ladle.entrypoints.cluster.front_server import build_front_app  # noqa: E402
from ladle.entrypoints.cluster.replica_http import (  # noqa: E402
    ENGINE_DEAD_HEADER,
    SLOT_HEADER,
    ReplicaSlot,
    SlotTable,
    end_slots,
    mark_engine_death,
)

EVENTS = [b'data: {"n": 1}\n\n', b'data: {"n": 2}\n\n', b"data: [DONE]\n\n"]
PROMPT_IDS = list(range(40))  # 2 full blocks of 16: a routing key


class _SlotCall:
    """Stands in for Ray's streaming slot call: the slot (or an error), then its end, which the
    replica sends once it is done with the request (here: at once)."""

    def __init__(self, answer: ReplicaSlot | Exception) -> None:
        self.answer = answer
        self.answered = False
        self.cancelled = False
        self.ended = False  # the front awaited the replica's end of the slot

    async def __anext__(self) -> ReplicaSlot:
        if not self.answered:
            self.answered = True
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer
        self.ended = True
        raise StopAsyncIteration

    def cancel(self) -> None:
        self.cancelled = True


class _Engine:
    """Stands in for the LadleReplica deployment handle: open_slot answers in turn."""

    def __init__(self, answers: list[ReplicaSlot | Exception]) -> None:
        self.answers = list(answers)
        self.keys: list[int | None] = []
        self.calls: list[_SlotCall] = []

    def options(self, stream: bool) -> _Engine:
        assert stream
        return self

    @property
    def open_slot(self) -> _Engine:
        return self

    def remote(self, routing_key: int | None = None) -> _SlotCall:
        self.keys.append(routing_key)
        self.calls.append(_SlotCall(self.answers.pop(0)))
        return self.calls[-1]


async def _replica(kind: str, heads: list[bytes] | None = None) -> tuple[asyncio.Server, str]:
    """A replica's HTTP server that answers one way: 'good' (an SSE stream, chunked, in pieces),
    'cut' (one event, then the connection drops), 'dead' (503 marked engine-dead) or 'endless'
    (events until the front hangs up, then b"hung up" in `heads`). Request heads are appended
    to `heads`."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if heads is not None:
            heads.append(head.lower())
        length = int(next(
            line.split(b":")[1] for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        ))  # fmt: skip
        await reader.readexactly(length)
        if kind == "dead":
            body = b'{"error": {"message": "engine died", "code": "engine_dead"}}'
            writer.write(
                b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                + f"{ENGINE_DEAD_HEADER}: 1\r\ncontent-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            writer.close()
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        if kind == "endless":  # an event every 10 ms until the front hangs up
            try:
                while True:
                    writer.write(b"%x\r\n%s\r\n" % (len(EVENTS[0]), EVENTS[0]))
                    await writer.drain()
                    await asyncio.sleep(0.01)
            except ConnectionError:
                if heads is not None:
                    heads.append(b"hung up")
                return
        events = EVENTS[:1] if kind == "cut" else EVENTS
        for event in events:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.01)
        if kind == "good":
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def _settings(max_attempts: int = 6) -> FrontSettings:
    return FrontSettings(
        tokenizer_path=None,
        block_size=16,
        num_prefix_blocks=4,
        num_replicas_asked=2,
        max_attempts=max_attempts,
        retry_backoff_s=0.01,
    )


async def _post(front: ReplicaFront) -> httpx.Response:
    transport = httpx.ASGITransport(app=build_front_app(front))
    async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
        return await client.post(
            "/v1/completions",
            json={"model": "m", "prompt": PROMPT_IDS, "stream": True},
            # A client's slot header never reaches a replica: it could end another's slot.
            headers={"authorization": "Bearer k", SLOT_HEADER: "forged"},
        )


def _count(counter, **labels) -> float:
    return (counter.labels(**labels) if labels else counter)._value.get()


def test_relays_the_replica_stream_after_retrying_replicas_that_did_not_answer():
    heads: list[bytes] = []

    async def scenario() -> tuple[httpx.Response, _Engine]:
        good, good_url = await _replica("good", heads)
        dead, dead_url = await _replica("dead")
        engine = _Engine([
            RuntimeError("engine core is gone"),  # the slot call fails
            ReplicaSlot("closed", _closed_port_url(), "s1"),  # nothing listens
            ReplicaSlot("dead", dead_url, "s2"),  # answers 503 with a dead engine
            ReplicaSlot("good", good_url, "s3"),
        ])  # fmt: skip
        front = ReplicaFront(engine, _settings(), lambda: 2)
        try:
            return await _post(front), engine
        finally:
            await front.close()
            good.close()
            dead.close()

    retried = _count(routing_metrics.RETRIED_REQUESTS)
    routed = _count(routing_metrics.ROUTED_REQUESTS, replica="good")
    response, engine = asyncio.run(scenario())
    [head] = heads
    assert f"{SLOT_HEADER}: s3\r\n".encode() in head and b"forged" not in head
    assert b"authorization: bearer k" in head  # the client's own headers go through
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.content == b"".join(EVENTS)  # byte for byte what the replica sent
    # The first attempt carries the prefix key; retries drop it (affinity would send them back).
    assert engine.keys[0] is not None and engine.keys[1:] == [None, None, None]
    # Failed attempts' slots are cancelled; the answered one is ended by its replica, awaited.
    assert [call.cancelled for call in engine.calls] == [True, True, True, False]
    assert engine.calls[-1].ended
    assert _count(routing_metrics.RETRIED_REQUESTS) - retried == 3
    assert _count(routing_metrics.ROUTED_REQUESTS, replica="good") - routed == 1


def test_a_cut_stream_ends_with_an_error_event_and_done():
    async def scenario() -> tuple[httpx.Response, _Engine]:
        cut, cut_url = await _replica("cut")
        engine = _Engine([ReplicaSlot("cut", cut_url, "s1")])
        front = ReplicaFront(engine, _settings(), lambda: 2)
        try:
            return await _post(front), engine
        finally:
            await front.close()
            cut.close()

    cut_streams = _count(routing_metrics.CUT_STREAMS)
    response, engine = asyncio.run(scenario())
    assert response.status_code == 200
    body = response.content
    assert body.startswith(EVENTS[0]) and body.endswith(b"data: [DONE]\n\n")
    error = json.loads(body[len(EVENTS[0]) :].split(b"\n\n")[0].removeprefix(b"data: "))
    assert error["error"]["code"] == "replica_failed"
    assert _count(routing_metrics.CUT_STREAMS) - cut_streams == 1
    assert engine.calls[0].cancelled


def test_no_replica_answering_is_a_503_after_max_attempts():
    engine = _Engine([RuntimeError("gone"), RuntimeError("gone")])
    front = ReplicaFront(engine, _settings(max_attempts=2), lambda: 0)
    response = asyncio.run(_post(front))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "replica_unavailable"
    assert len(engine.calls) == 2


@pytest.mark.parametrize(
    ("running", "status_code", "status"),
    [(2, 200, "ok"), (1, 200, "degraded"), (0, 503, "unavailable")],
)
def test_health_counts_running_replicas(running, status_code, status):
    async def get() -> httpx.Response:
        front = ReplicaFront(_Engine([]), _settings(), lambda: running)
        transport = httpx.ASGITransport(app=build_front_app(front))
        async with httpx.AsyncClient(transport=transport, base_url="http://front") as client:
            return await client.get("/health")

    response = asyncio.run(get())
    assert response.status_code == status_code
    assert response.json() == {"status": status, "replicas_running": running, "replicas_asked": 2}


def test_bad_front_settings_are_refused():
    with pytest.raises(ValueError, match="max_attempts must be >= 1"):
        ReplicaFront(_Engine([]), _settings(max_attempts=0), lambda: 1)


def test_engine_death_marks_only_5xx_answers_of_a_dead_engine():
    async def answer(status: int, alive: bool) -> list[tuple[bytes, bytes]]:
        async def app(scope, receive, send):
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        sent = []

        async def send(message):
            sent.append(message)

        await mark_engine_death(app, lambda: alive)({"type": "http"}, None, send)
        return sent[0]["headers"]

    marked = (ENGINE_DEAD_HEADER.encode(), b"1")
    assert asyncio.run(answer(503, alive=False)) == [marked]
    assert asyncio.run(answer(503, alive=True)) == []
    assert asyncio.run(answer(400, alive=False)) == []


def test_a_slot_ends_when_its_request_ends_or_when_no_request_claims_it():
    async def scenario() -> tuple[bool, bool, int]:
        slots = SlotTable()

        async def app(scope, receive, send):
            await asyncio.sleep(0.05)  # the request is being answered

        served = end_slots(app, slots)
        slot_id = slots.open()
        waiter = asyncio.create_task(slots.wait_until_done(slot_id))
        request = asyncio.create_task(
            served({"type": "http", "headers": [(SLOT_HEADER.encode(), slot_id.encode())]},
                   None, None)
        )  # fmt: skip
        await asyncio.sleep(0.01)
        running_while_answering = not waiter.done()
        await request
        await asyncio.wait_for(waiter, timeout=1)  # ended with its request
        unclaimed = slots.open()
        await slots.wait_until_done(unclaimed, unclaimed_s=0.01)  # nobody came: ends anyway
        return running_while_answering, waiter.done(), len(slots)

    assert asyncio.run(scenario()) == (True, True, 0)


def test_a_client_that_leaves_ends_the_relay_and_the_replica_connection():
    """Through a real server (uvicorn): the front notices the client is gone, closes its
    connection to the replica (which aborts the request there) and cancels the slot."""
    import uvicorn

    from ladle.entrypoints.cluster.front_server import build_front_app
    from ladle.entrypoints.openai.http_server_options import HttpServerOptions

    async def scenario() -> tuple[list[bytes], _Engine]:
        heads: list[bytes] = []
        endless, endless_url = await _replica("endless", heads)
        engine = _Engine([ReplicaSlot("endless", endless_url, "s1")])
        front = ReplicaFront(engine, _settings(), lambda: 2)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        server = uvicorn.Server(
            HttpServerOptions(log_level="warning").uvicorn_config(build_front_app(front))
        )
        serving = asyncio.create_task(server.serve(sockets=[listener]))
        while not server.started:
            await asyncio.sleep(0.01)
        try:
            url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1/completions"
            async with httpx.AsyncClient() as client:
                body = {"model": "m", "prompt": PROMPT_IDS, "stream": True}
                async with client.stream("POST", url, json=body) as response:
                    async for _ in response.aiter_bytes():
                        break  # one piece, then leave
            for _ in range(200):
                if b"hung up" in heads:
                    break
                await asyncio.sleep(0.01)
            return heads, engine
        finally:
            server.should_exit = True
            await serving
            endless.close()

    heads, engine = asyncio.run(scenario())
    assert heads[-1] == b"hung up"
    assert engine.calls[0].cancelled
