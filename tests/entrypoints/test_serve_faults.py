"""Faults: the engine process dies mid-stream; the API process dies; SIGTERM drains. Each test
runs its own server, since each ends it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.entrypoints.conftest import SERVED_NAME
from tests.entrypoints.server_process import (
    ServerProcess,
    process_exists,
    process_is_running,
    read_metrics,
    wait_until,
)

# The tiny model with a long context, so one request can run far longer than the test waits:
# 8000 decode steps take tens of seconds even on a fast machine.
MAX_MODEL_LEN = 8192
LONG = {"max_tokens": 8000, "ignore_eos": True}


@pytest.fixture(scope="module")
def long_model_path(tmp_path_factory) -> str:
    from tests.helpers.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("long"), "llama",
                           max_position_embeddings=MAX_MODEL_LEN)


def start_server(model_path: str, *extra: str) -> ServerProcess:
    return ServerProcess(
        [model_path, "--served-model-name", SERVED_NAME, "--cpu-kv-cache-gib", "0.1", *extra]
    ).start()


def exited_cleanly(server: ServerProcess) -> bool:
    # uvicorn re-raises the SIGTERM it handled once it has shut down, as a well-behaved
    # process does, so a graceful exit reads as -SIGTERM.
    return server.process.returncode in (0, -signal.SIGTERM)


@pytest.mark.slow  # kills its own server, 15-25 s
def test_engine_death_fails_in_flight_requests_and_health(long_model_path):
    server = start_server(long_model_path)
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused",
                               max_retries=0, timeout=30)
        in_flight_status: list[int] = []

        async def non_streaming() -> None:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                response = await http.post("/v1/completions", json={
                    "model": SERVED_NAME, "prompt": "hello", **LONG})
                in_flight_status.append(response.status_code)
                assert response.json()["error"]["code"] == "engine_dead"

        loop = asyncio.new_event_loop()
        pending = loop.create_task(non_streaming())
        loop.run_until_complete(asyncio.sleep(0.3))
        stream = client.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": "hi"}], stream=True,
            extra_body=LONG,
        )
        chunks = iter(stream)
        next(chunks)
        next(chunks)
        dead_pid = server.engine_pid
        os.kill(dead_pid, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(openai.APIError, match="engine"):
            for _ in chunks:
                pass
        assert time.monotonic() - killed < 5, "the stream did not fail promptly"
        loop.run_until_complete(asyncio.wait_for(pending, 10))
        loop.close()
        assert in_flight_status == [500]
        health = httpx.get(f"{server.base_url}/health")
        assert health.status_code == 503
        assert "engine" in health.json()["error"]["message"]
        assert httpx.get(f"{server.base_url}/metrics").status_code == 200
        # Issue 7: the server heals. The dead engine is reaped (no zombie), a new one starts,
        # /health is 200 again and requests are served; the metrics count the restart.
        assert wait_until(lambda: not process_exists(dead_pid), timeout_s=10), "zombie engine"
        assert wait_until(lambda: is_healthy(server), timeout_s=120), server.log()
        assert wait_until(lambda: server.engine_pid != dead_pid, timeout_s=5)
        assert process_is_running(server.engine_pid)
        completion = client.completions.create(model=SERVED_NAME, prompt="hi", max_tokens=2)
        assert completion.choices[0].finish_reason == "length"
        assert read_metrics(server)["ladle:engine_restarts_total"] == 1
    finally:
        server.stop(timeout_s=20)
    assert exited_cleanly(server), server.log()


def is_healthy(server: ServerProcess) -> bool:
    try:
        return httpx.get(f"{server.base_url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow  # kills its own engine, 20-60 s
def test_restarts_are_bounded_then_the_server_exits_non_zero(tiny_model_path):
    server = start_server(tiny_model_path("llama"), "--max-engine-restarts", "1")
    try:
        first_pid = server.engine_pid
        os.kill(first_pid, signal.SIGKILL)
        assert wait_until(lambda: server.engine_pid != first_pid and is_healthy(server), 120)
        os.kill(server.engine_pid, signal.SIGKILL)  # the second death spends the budget
        assert server.process.wait(60) == 1
        assert "not restarting it (1 restarts within 300s)" in server.log()
    finally:
        server.stop()


@pytest.mark.slow  # kills its own engine, 20-60 s
def test_no_engine_restart_exits_non_zero_when_the_engine_dies(tiny_model_path):
    server = start_server(tiny_model_path("llama"), "--no-engine-restart")
    try:
        engine_pid = server.engine_pid
        os.kill(engine_pid, signal.SIGKILL)
        assert server.process.wait(30) == 1
        assert "restarts are off" in server.log()
        assert not process_exists(engine_pid)
    finally:
        server.stop()


@pytest.mark.slow  # kills its own server, 15-25 s
def test_api_death_stops_the_engine(tiny_model_path):
    server = start_server(tiny_model_path("llama"))
    engine_pid = server.engine_pid
    assert process_is_running(engine_pid)
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(10)
    assert wait_until(lambda: not process_is_running(engine_pid), timeout_s=5), (
        "the engine process outlived the API process"
    )


@pytest.mark.slow  # kills its own server, 15-25 s
def test_sigterm_drains_then_exits_within_the_bound(long_model_path):
    server = start_server(long_model_path, "--shutdown-timeout", "3")
    engine_pid = server.engine_pid
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                           timeout=60)
    short = client.completions.create(model=SERVED_NAME, prompt="hi", max_tokens=30,
                                      stream=True, extra_body={"ignore_eos": True})
    endless = client.completions.create(model=SERVED_NAME, prompt="hi", stream=True,
                                        extra_body=LONG)
    short_chunks, endless_chunks = iter(short), iter(endless)
    next(short_chunks)
    next(endless_chunks)
    server.process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    # The short request drains: it finishes normally after the signal.
    finish_reasons = [c.choices[0].finish_reason for c in short_chunks if c.choices]
    assert finish_reasons[-1] == "length"
    # The endless one is cut at the bound (it ends without a finish reason), and the whole
    # server exits.
    endless_reasons = []
    with contextlib.suppress(openai.APIError, httpx.HTTPError):
        endless_reasons = [c.choices[0].finish_reason for c in endless_chunks if c.choices]
    assert "length" not in endless_reasons
    server.process.wait(20)
    assert time.monotonic() - sent < 3 + 10
    assert exited_cleanly(server), server.log()
    assert wait_until(lambda: not process_is_running(engine_pid), timeout_s=5)
    assert "Shutting down" in server.log()


def test_a_model_that_cannot_load_is_one_clear_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "ladle.cli", "serve", str(tmp_path / "missing"), "--port", "0"],
        check=False, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1
    assert "does not exist" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert "Uvicorn running" not in result.stderr + result.stdout  # no port was bound


@pytest.mark.slow  # a two-rank server, killed and healed, 15-30 s
def test_a_dead_rank_fails_its_requests_then_the_server_heals_with_new_ranks(long_model_path):
    """`-tp 2`: SIGKILL to one worker rank. The streaming request fails promptly with the
    engine named, /health says 503, the engine and its other rank go (no orphan), a new engine
    with two new ranks starts and answers."""
    import psutil

    server = start_server(long_model_path, "-tp", "2")
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused",
                               max_retries=0, timeout=30)
        old_engine = server.engine_pid
        old_ranks = psutil.Process(old_engine).children(recursive=True)
        assert len(old_ranks) == 2, server.log()
        stream = client.completions.create(
            model=SERVED_NAME, prompt="hello", stream=True, max_tokens=8000,
            extra_body={"ignore_eos": True},
        )
        chunks = iter(stream)
        next(chunks)
        os.kill(old_ranks[1].pid, signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(openai.APIError, match="engine"):
            for _ in chunks:
                pass
        assert time.monotonic() - killed < 10, "the stream did not fail promptly"
        assert wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                                          for p in old_ranks), timeout_s=20), "orphan rank"
        assert wait_until(lambda: is_healthy(server), timeout_s=120), server.log()
        assert wait_until(lambda: server.engine_pid != old_engine, timeout_s=5)
        new_ranks = psutil.Process(server.engine_pid).children(recursive=True)
        assert len(new_ranks) == 2 and not {p.pid for p in new_ranks} & {p.pid for p in old_ranks}
        completion = client.completions.create(model=SERVED_NAME, prompt="hi", max_tokens=2)
        assert completion.choices[0].finish_reason == "length"
    finally:
        server.stop()
