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
