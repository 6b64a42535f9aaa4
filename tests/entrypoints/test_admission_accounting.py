"""Admission accounting cannot leak: a request's queue slot and queued tokens are released on
every path out of the API process's engine client (success, rejected by the engine, failed to
send, aborted, abandoned, engine death), and the counts return to zero after each."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from ladle.frontend.admission import AdmissionController
from ladle.frontend.client import AsyncEngineClient, EngineDeadError
from ladle.frontend.metrics import ServerMetrics
from ladle.frontend.restart_policy import RestartPolicy
from ladle.protocol.messages import RequestRejectedError
from ladle.sampling.params import SamplingParams

PROMPT = [5, 6, 7, 8]


def assert_nothing_queued(client: AsyncEngineClient, engine_alive: bool = True) -> None:
    admission = client.admission
    assert (admission.num_queued_requests, admission.num_queued_tokens) == (0, 0)
    if engine_alive:
        # No request is left open in the API process: the output processor tracks none.
        assert not client.output_processor.has_unfinished_requests()


async def drain(stream) -> list:
    return [output async for output in stream]


async def every_path(model_path: str) -> None:
    admission = AdmissionController(max_queued_requests=4, max_queued_tokens=1000)
    client = AsyncEngineClient(
        {"model": model_path, "cpu_kv_cache_gib": 0.05, "block_size": 16},
        ServerMetrics("tiny"), admission, restart_policy=RestartPolicy(enabled=False),
    )
    await client.start()
    try:
        vocab_size = client.info.vocab_size
        # Success, n=2.
        params = SamplingParams(n=2, max_tokens=3, temperature=0.0, ignore_eos=True)
        stream = client.add_request("ok", None, PROMPT, params)
        assert (admission.num_queued_requests, admission.num_queued_tokens) == (2, 8)
        outputs = await drain(stream)
        assert outputs[-1].finished and all(len(c.token_ids) == 3 for c in outputs[-1].outputs)
        assert_nothing_queued(client)

        # Rejected by the engine (a 4xx): top_k past the vocabulary.
        stream = client.add_request(
            "rejected", None, PROMPT, SamplingParams(top_k=vocab_size + 1, max_tokens=2)
        )
        with pytest.raises(RequestRejectedError, match="vocabulary"):
            await drain(stream)
        assert_nothing_queued(client)

        # Never reached the engine (a 5xx): the message cannot be encoded. This is the path
        # priority 2**64 took before validation, and it kept its slot forever.
        for _ in range(5):
            with pytest.raises(OverflowError):
                client.add_request("unsendable", None, PROMPT, SamplingParams(max_tokens=2),
                                   priority=2**64)
        assert_nothing_queued(client)
        outputs = await drain(client.add_request("after", None, PROMPT,
                                                 SamplingParams(max_tokens=2)))
        assert outputs[-1].finished

        # Aborted after its first output, and abandoned before any (client disconnects).
        long_params = SamplingParams(max_tokens=500, ignore_eos=True)
        stream = client.add_request("aborted", None, PROMPT, long_params)
        await stream.__anext__()
        stream.close()
        client.add_request("abandoned", None, PROMPT, long_params).close()
        assert_nothing_queued(client)

        # Engine death while requests are queued and running.
        streams = [client.add_request(f"doomed-{i}", None, PROMPT, long_params)
                   for i in range(3)]
        await streams[0].__anext__()
        os.kill(client.engine_pid, signal.SIGKILL)
        for stream in streams:
            with pytest.raises(EngineDeadError):
                await asyncio.wait_for(drain(stream), 10)
        # Every stream ended above; a dead client takes nothing new.
        assert_nothing_queued(client, engine_alive=False)
        with pytest.raises(EngineDeadError):
            client.add_request("late", None, PROMPT, SamplingParams(max_tokens=2))
    finally:
        await client.shutdown()


def test_admission_is_released_on_every_path(tiny_model_path):
    asyncio.run(every_path(tiny_model_path("llama")))
