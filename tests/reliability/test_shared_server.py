"""Reliability against one shared `ladle serve` of the default model: mixed load, abandoned
streams, and an overload burst whose clients retry as told (issue 7, deliverable 6)."""

from __future__ import annotations

import asyncio
import random
import time

import httpx

from tests.entrypoints.server_process import engine_is_idle, read_metrics, wait_until
from tests.reliability.conftest import MAX_NUM_SEQS, MAX_QUEUED_REQUESTS
from tests.reliability.traffic import make_request, run_clients, send


def test_load_300_mixed_requests_at_48_concurrent(default_server):
    started = time.monotonic()
    # A generous client timeout: on a busy 2-core machine the last of 300 requests queues for
    # minutes; what counts is that none is lost or fails.
    outcomes = asyncio.run(run_clients(default_server.base_url, num_requests=300,
                                       num_clients=48, timeout_s=900))
    elapsed = time.monotonic() - started
    print(f"\n300 requests, 48 clients: {elapsed:.1f}s")
    assert len(outcomes) == 300  # none lost
    failures = [o for o in outcomes if o.status != 200 or o.error is not None]
    assert not failures, failures[:3]
    assert all(o.finish_reason in ("stop", "length") for o in outcomes)
    assert wait_until(lambda: engine_is_idle(default_server), timeout_s=5)


async def abandon_streams(base_url: str, num_streams: int) -> None:
    rng = random.Random(3)
    async with httpx.AsyncClient(base_url=base_url, timeout=60,
                                 limits=httpx.Limits(max_connections=num_streams)) as http:

        async def abandon(index: int) -> None:
            body = {"prompt": f"story number {index}", "max_tokens": 400, "ignore_eos": True,
                    "stream": True}
            chunks_wanted = rng.randint(1, 3)
            async with http.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200
                seen = 0
                async for line in response.aiter_lines():
                    seen += line.startswith("data: {")
                    if seen >= chunks_wanted:
                        return  # leaves mid-stream: the connection closes

        # The first MAX_NUM_SEQS run, the rest wait; each leaves once it has streamed a little.
        await asyncio.gather(*(abandon(i) for i in range(num_streams)))


def test_abandoned_streams_are_aborted_promptly(default_server):
    aborted_before = read_metrics(default_server).get("ladle:requests_aborted_total", 0)
    asyncio.run(abandon_streams(default_server.base_url, 40))
    left = time.monotonic()
    assert wait_until(lambda: engine_is_idle(default_server), timeout_s=2), (
        read_metrics(default_server)
    )
    print(f"\nengine idle {time.monotonic() - left:.2f}s after the last client left")
    aborted = read_metrics(default_server)["ladle:requests_aborted_total"] - aborted_before
    assert aborted == 40


async def burst_with_retries(base_url: str, num_clients: int) -> tuple[list, list[int]]:
    """Every client sends once at the same moment and retries as Retry-After says."""
    rng = random.Random(5)
    requests = [make_request(rng, max_tokens=4) for _ in range(num_clients)]
    statuses_seen: list[int] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=120,
                                 limits=httpx.Limits(max_connections=num_clients)) as http:

        async def client(path: str, body: dict):
            for _ in range(60):
                outcome = await send(http, path, body)
                statuses_seen.append(outcome.status)
                if outcome.status != 429:
                    return outcome
                await asyncio.sleep(float(outcome.retry_after))
            return outcome

        outcomes = await asyncio.gather(*(client(path, body) for path, body in requests))
    return outcomes, statuses_seen


def test_overload_gets_429_and_retrying_clients_all_get_served(default_server):
    num_clients = MAX_NUM_SEQS + MAX_QUEUED_REQUESTS + 70
    outcomes, statuses = asyncio.run(burst_with_retries(default_server.base_url, num_clients))
    assert 429 in statuses, "the burst never exceeded the queue bound"
    assert not [s for s in statuses if s >= 500 or s == 0]
    assert all(o.status == 200 and o.finish_reason in ("stop", "length") for o in outcomes), [
        o for o in outcomes if o.status != 200][:3]
    print(f"\n{num_clients} clients, {statuses.count(429)} refusals before all were served")
    assert wait_until(lambda: engine_is_idle(default_server), timeout_s=5)
