"""Issue 32: SIGTERM or SIGINT to the server's whole process group (what systemd, a shell's job
control or `make run`'s terminal send) stops the server once: the engine process is not
restarted, the server exits within its shutdown timeout, and no semaphore or shared-memory
object is left for multiprocessing's resource tracker to warn about."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.entrypoints.conftest import TINY_ENGINE_ARGS
from tests.entrypoints.server_process import ServerProcess

SHUTDOWN_TIMEOUT_S = 5


@pytest.mark.parametrize(
    "signal_number",
    [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.slow)],  # ~8 s each
)
def test_a_signal_to_the_process_group_stops_the_server_once(tiny_model_path, signal_number):
    server = ServerProcess(
        [tiny_model_path("llama"), *TINY_ENGINE_ARGS,
         "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)],
        new_session=True,
    ).start()
    try:
        engine_pid = server.engine_pid
        sent = time.monotonic()
        os.killpg(server.pid, signal_number)
        return_code = server.process.wait(SHUTDOWN_TIMEOUT_S + 10)
        elapsed_s = time.monotonic() - sent
    finally:
        server.stop()
    assert server.wait_for_output_end(10), "a process of the server kept its output open"
    log = server.log()
    assert return_code in (0, -signal.SIGTERM), log
    assert elapsed_s < SHUTDOWN_TIMEOUT_S, (elapsed_s, log)
    assert log.count("engine core running") == 1, log
    assert log.count("memory budget") == 1, f"the engine loaded again:\n{log}"
    assert "restarted" not in log and "engine process died" not in log, log
    assert "leaked" not in log and "resource_tracker" not in log, log
    assert not os.path.exists(f"/proc/{engine_pid}"), "the engine process outlived the server"


@pytest.mark.slow  # a server of its own, ~10-20 s
@pytest.mark.parametrize(
    ("executor_args", "num_workers"),
    [(["--distributed-executor-backend", "mp"], 1), (["-tp", "2"], 2), (["-pp", "2"], 2)],
    ids=["mp", "tp2", "pp2"],
)
def test_the_multi_process_executor_serves_and_stops_with_the_group(
    tiny_model_path, executor_args, num_workers
):
    """`--distributed-executor-backend mp` or `-tp 2`: the engine-core process (a daemonic
    multiprocessing child) starts its worker processes, the server answers through them (the
    official openai client, streaming; the tokens of the one-process engine), and SIGTERM to the
    group stops every process with nothing left behind."""
    import openai
    import psutil

    from ladle import LLM, SamplingParams
    from tests.entrypoints.conftest import TINY_ENGINE_OPTIONS

    path = tiny_model_path("llama")
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    (expected,) = LLM(path, **TINY_ENGINE_OPTIONS).generate(["the cat"], greedy, use_tqdm=False)
    server = ServerProcess(
        [path, *TINY_ENGINE_ARGS, *executor_args, "--served-model-name", "tiny",
         "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)],
        new_session=True,
    ).start()
    try:
        workers = psutil.Process(server.engine_pid).children(recursive=True)
        assert len(workers) == num_workers, server.log()
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", timeout=60)
        stream = client.completions.create(
            model="tiny", prompt="the cat", max_tokens=6, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
        chunks = list(stream)
        text = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
        assert text == expected.outputs[0].text
        assert chunks[-1].usage.completion_tokens == 6
        os.killpg(server.pid, signal.SIGTERM)
        return_code = server.process.wait(SHUTDOWN_TIMEOUT_S + 10)
    finally:
        server.stop()
    assert server.wait_for_output_end(10), "a process of the server kept its output open"
    log = server.log()
    assert return_code in (0, -signal.SIGTERM), log
    assert "died" not in log and "leaked" not in log and "Traceback" not in log, log
    for worker in workers:
        assert not worker.is_running() or worker.status() == psutil.STATUS_ZOMBIE, log
