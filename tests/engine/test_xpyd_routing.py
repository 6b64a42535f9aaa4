"""xPyD routing of DisaggregatedClient with recording stand-ins for the engines (2P2D): split
prompts spread over the prefill engines, handoffs over the decode engines, the release goes to
the prefill engine that holds the KV, short prompts run whole on the least loaded engine of
all, a dead prefill engine's prompts are re-sent to a live engine, and the combined stats sum
every engine."""

from __future__ import annotations

import asyncio

import pytest

from ladle.frontend.admission import AdmissionController
from ladle.frontend.client import EngineDeadError, EngineInfo
from ladle.frontend.disagg_client import DECODE, PREFILL, DisaggregatedClient
from ladle.frontend.instance_picking import least_loaded, role_name
from ladle.frontend.metrics import ServerMetrics
from ladle.frontend.output_processor import OutputProcessor
from ladle.protocol import wire
from ladle.protocol.messages import EngineCoreOutput, SchedulerStats
from tests.engine.test_disagg_client import PARAMS, FakeInstance, handoff


@pytest.fixture()
def client():
    client = DisaggregatedClient({"model": "m"}, ServerMetrics("m"),
                                 AdmissionController(None, None), num_prefill=2, num_decode=2)
    assert [i.role for i in client.instances] == ["prefill 0", "prefill 1", "decode 2",
                                                  "decode 3"]
    client.instances = [FakeInstance(role_name(i, 2)[0], i) for i in range(4)]
    client.output_processor = OutputProcessor(None, (2,))
    client.info = EngineInfo(max_model_len=128, memory_budget="", vocab_size=100)
    client.dead_reason = None
    return client


def added_ids(instance) -> list[str]:
    return [r.request_id for m in instance.sent if isinstance(m, wire.AddRequests)
            for r in m.requests]


def test_splits_spread_and_release_goes_to_the_holder(client):
    async def run():
        p0, p1, d2, d3 = client.instances
        streams = [client.add_request(name, None, [5, 6, 7], PARAMS) for name in "abcd"]
        assert added_ids(p0) == ["a", "c"] and added_ids(p1) == ["b", "d"]
        # Handoffs: each to the decode engine with fewer sequences on it now.
        client._on_step(p1, handoff("b", 9))
        client._on_step(p0, handoff("a", 8))
        assert added_ids(d2) == ["b"] and added_ids(d3) == ["a"]
        for stream in streams[:2]:
            await stream.__anext__()
        # The decode engine's first output releases the KV on the prefill engine holding it.
        client._on_step(d2, wire.EngineStep([EngineCoreOutput("b", [10])]))
        client._on_step(d3, wire.EngineStep([EngineCoreOutput("a", [10])]))
        assert p1.sent[-1] == wire.AbortRequests(["b"])
        assert p0.sent[-1] == wire.AbortRequests(["a"])
        assert not any(isinstance(m, wire.AbortRequests) for m in d2.sent + d3.sent)

    asyncio.run(run())


def test_short_prompts_run_whole_on_the_least_loaded_engine(client):
    async def run():
        client.min_prompt_tokens = 3
        for name in ("long1", "long2"):
            client.add_request(name, None, [5, 6, 7], PARAMS)  # one on each prefill engine
        for name in ("s1", "s2", "s3"):
            client.add_request(name, None, [5], PARAMS)
        # Loads (1, 1, 0, 0): the decode engines first, then all tie at 1: decode on a tie.
        p0, p1, d2, d3 = client.instances
        assert added_ids(d2) == ["s1", "s3"] and added_ids(d3) == ["s2"]
        assert (client.num_split, client.num_whole) == (2, 3)

    asyncio.run(run())


def test_a_dead_prefill_engine_leaves_the_others_serving(client):
    async def run():
        p0, p1, d2, d3 = client.instances
        client.add_request("a", None, [5, 6, 7], PARAMS)  # on p0, still in its prefill
        client.add_request("b", None, [5, 6, 7], PARAMS)  # on p1
        client._on_step(p1, handoff("b", 9))  # b decodes on d2, its KV held by p1
        p1.is_alive = False
        client._on_instance_dead(p1, "killed")
        assert client.dead_reason is None and "prefill 1" in client.health_problem
        assert client._routes["b"].holder is None  # its blocks died with p1: nothing to free
        client.add_request("c", None, [5, 6, 7], PARAMS)  # split on the live prefill engine
        assert added_ids(p0) == ["a", "c"]
        assert client._routes["c"].request.kv_transfer_params is None  # as the client sent it
        p0.is_alive = False
        client._on_instance_dead(p0, "killed")
        # a and c streamed nothing: re-sent whole to the decode engines.
        assert sorted(added_ids(d2) + added_ids(d3)) == ["a", "b", "c"]
        assert client.num_retried_on_decode == 2
        client.add_request("d", None, [5, 6, 7], PARAMS)  # no prefill engine: whole
        assert client._routes["d"].engine in (d2, d3) and client._routes["d"].phase == "whole"

    asyncio.run(run())


def test_combined_stats_sum_every_engine(client):
    for index, instance in enumerate(client.instances):
        client.instance_stats[instance.role] = SchedulerStats(
            num_running_reqs=index, num_free_blocks=10 - index, num_total_blocks=10,
            num_kv_pulls=index,
        )
    stats = client._combined_stats()
    assert stats.num_running_reqs == 6 and stats.num_kv_pulls == 6
    assert (stats.num_free_blocks, stats.num_total_blocks) == (34, 40)
    assert stats.kv_cache_usage == pytest.approx(6 / 40)


def test_least_loaded_prefers_live_then_decode_then_index():
    engines = [FakeInstance(PREFILL, 0), FakeInstance(PREFILL, 1), FakeInstance(DECODE, 2)]
    from collections import Counter

    assert least_loaded(engines, Counter()) is engines[2]
    assert least_loaded(engines[:2], Counter({id(engines[0]): 1})) is engines[1]
    engines[1].is_alive = False
    assert least_loaded(engines[:2], Counter({id(engines[0]): 5})) is engines[0]
    engines[0].is_alive = False
    assert least_loaded(engines[:2], Counter()) is None


def test_a_dead_decode_engine_fails_only_its_streams_and_frees_their_kv():
    async def run():
        client = DisaggregatedClient({"model": "m"}, ServerMetrics("m"),
                                     AdmissionController(None, None), num_prefill=1, num_decode=2)
        client.instances = [FakeInstance(role_name(i, 1)[0], i) for i in range(3)]
        client.output_processor = OutputProcessor(None, (2,))
        client.info = EngineInfo(max_model_len=128, memory_budget="", vocab_size=100)
        client.dead_reason = None
        p0, d1, d2 = client.instances
        streams = {name: client.add_request(name, None, [5, 6, 7], PARAMS) for name in "ab"}
        client._on_step(p0, wire.EngineStep([*handoff("a", 8).outputs, *handoff("b", 9).outputs]))
        assert added_ids(d1) == ["a"] and added_ids(d2) == ["b"]  # one each
        for stream in streams.values():
            await stream.__anext__()
        d1.is_alive = False
        client._on_instance_dead(d1, "killed")
        with pytest.raises(EngineDeadError, match="decode 1 engine died"):
            await streams["a"].__anext__()
        assert wire.AbortRequests(["a"]) in p0.sent  # its KV released on its prefill engine
        assert "b" in client._routes and client.dead_reason is None
        client._on_step(d2, wire.EngineStep([EngineCoreOutput("b", [10], finish_reason="length")]))
        assert p0.sent[-1] == wire.AbortRequests(["b"])  # released at its first decode output
        client.add_request("c", None, [5, 6, 7], PARAMS)
        client._on_step(p0, handoff("c", 7))
        assert added_ids(d2) == ["b", "c"]  # the live decode engine takes the handoff

    asyncio.run(run())
