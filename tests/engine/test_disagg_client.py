"""DisaggregatedClient's routing, with two recording stand-ins for the engine processes: a
request goes to the prefill engine with do_remote_decode, its handoff turns into the first
token (streamed once) and a decode request carrying it, the held KV is released at the decode
engine's first answer; a dead prefill engine's requests in prefill are re-sent whole to the
decode engine, a dead decode engine fails its requests and releases their KV."""

from __future__ import annotations

import asyncio

import pytest

from ladle.frontend.admission import AdmissionController
from ladle.frontend.client import EngineDeadError, EngineInfo
from ladle.frontend.disagg_client import DECODE, PREFILL, DisaggregatedClient
from ladle.frontend.metrics import ServerMetrics
from ladle.frontend.output_processor import OutputProcessor
from ladle.protocol import wire
from ladle.protocol.messages import EngineCoreOutput
from ladle.sampling.params import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


class FakeInstance:
    def __init__(self, kind: str, index: int) -> None:
        self.kind = kind
        self.role = f"{kind} {index}"
        self.sent: list = []
        self.is_alive = True

    def send(self, message) -> bool:
        if not self.is_alive:
            return False
        self.sent.append(message)
        return True


@pytest.fixture()
def client():
    admission = AdmissionController(None, None)
    client = DisaggregatedClient({"model": "m"}, ServerMetrics("m"), admission)
    client.instances = [FakeInstance(PREFILL, 0), FakeInstance(DECODE, 1)]
    client.output_processor = OutputProcessor(None, (2,))
    client.info = EngineInfo(max_model_len=128, memory_budget="", vocab_size=100)
    client.dead_reason = None
    return client


def handoff(request_id: str, token: int) -> wire.EngineStep:
    params = {"do_remote_prefill": True, "remote_kv": "pool", "remote_block_ids": [3],
              "block_size": 16, "sampling_seed": 7}
    return wire.EngineStep([EngineCoreOutput(request_id, [token], finish_reason="remote_decode",
                                             kv_transfer_params=params)])


def test_prefill_then_decode_then_release(client):
    async def run():
        stream = client.add_request("a", None, [5, 6, 7], PARAMS)
        [added] = client.prefill.sent
        assert added.requests[0].kv_transfer_params == {"do_remote_decode": True}
        client._on_step(client.prefill, handoff("a", 9))
        first = await stream.__anext__()
        assert first.outputs[0].token_ids_delta == [9] and not first.finished
        [to_decode] = client.decode.sent
        transfer = to_decode.requests[0].kv_transfer_params
        assert transfer["first_token_ids"] == [9] and transfer["remote_block_ids"] == [3]
        client._on_step(client.decode, wire.EngineStep([EngineCoreOutput("a", [10, 11])]))
        assert client.prefill.sent[-1] == wire.AbortRequests(["a"])  # the held KV goes
        client._on_step(client.decode,
                        wire.EngineStep([EngineCoreOutput("a", [12], finish_reason="length")]))
        outputs = [first]
        async for output in stream:
            outputs.append(output)
        assert sum((o.outputs[0].token_ids_delta for o in outputs), []) == [9, 10, 11, 12]
        assert outputs[-1].finished and not client._routes

    asyncio.run(run())


def test_dead_prefill_engine_resends_prefills_whole(client):
    async def run():
        client.add_request("a", None, [5, 6, 7], PARAMS)
        client.prefill.is_alive = False
        client._on_instance_dead(client.prefill, "killed")
        assert "degraded" in client.health_problem and client.dead_reason is None
        [resent] = client.decode.sent
        assert resent.requests[0].kv_transfer_params is None
        assert client.num_retried_on_decode == 1
        # While it is down, new requests run whole on the decode engine; with none left, the
        # server refuses them.
        client.add_request("b", None, [5, 6, 7], PARAMS)
        assert client.decode.sent[-1].requests[0].kv_transfer_params is None
        client.decode.is_alive = False
        client._on_instance_dead(client.decode, "killed")
        with pytest.raises(EngineDeadError, match="every engine is down"):
            client.add_request("c", None, [5], PARAMS)

    asyncio.run(run())


def test_dead_decode_engine_fails_its_requests_and_releases(client):
    async def run():
        stream = client.add_request("a", None, [5, 6, 7], PARAMS)
        client._on_step(client.prefill, handoff("a", 9))
        await stream.__anext__()
        client.decode.is_alive = False
        client._on_instance_dead(client.decode, "killed")
        with pytest.raises(EngineDeadError, match="decode 1 engine died"):
            await stream.__anext__()
        assert wire.AbortRequests(["a"]) in client.prefill.sent
        assert not client._routes

    asyncio.run(run())


def test_a_first_token_that_ends_the_request_never_reaches_the_decode_engine(client):
    async def run():
        stream = client.add_request("a", None, [5, 6, 7], PARAMS)
        # EOS (or a stop token, or max_tokens=1) on the prefill engine: it ended there, and
        # freed its blocks itself (no handoff).
        client._on_step(client.prefill, wire.EngineStep(
            [EngineCoreOutput("a", [2], finish_reason="stop")]
        ))
        output = await stream.__anext__()
        assert output.finished and output.outputs[0].token_ids_delta == [2]
        assert client.decode.sent == [] and not client._routes
        assert all(not isinstance(m, wire.AbortRequests) for m in client.prefill.sent)

    asyncio.run(run())


def test_short_prompts_run_whole_on_the_less_busy_engine(client):
    async def run():
        client.min_prompt_tokens = 3
        client.add_request("long", None, [5, 6, 7], PARAMS)  # split: prefill engine first
        for name in ("short1", "short2", "short3"):
            client.add_request(name, None, [5, 6], PARAMS)
        # Loads (prefill, decode): (1, 0) -> decode; (1, 1) -> decode on a tie; (1, 2) -> prefill.
        assert [m.requests[0].request_id for m in client.decode.sent] == ["short1", "short2"]
        sent_to_prefill = [m.requests[0] for m in client.prefill.sent]
        assert [r.request_id for r in sent_to_prefill] == ["long", "short3"]
        assert sent_to_prefill[1].kv_transfer_params is None  # whole, not split
        # A whole request's outputs count from its own engine only.
        client._on_step(client.decode, wire.EngineStep([EngineCoreOutput("short3", [1])]))
        assert not client._routes["short3"].streamed
        client._on_step(client.prefill, wire.EngineStep(
            [EngineCoreOutput("short3", [4], finish_reason="length")]
        ))
        assert "short3" not in client._routes

    asyncio.run(run())
