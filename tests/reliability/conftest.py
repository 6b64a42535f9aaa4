"""The reliability suite (issue 7) runs against a real `ladle serve` of the default model
(SmolLM2-135M-Instruct, Q4_1 GGUF) on the CPU. Tests that do not end the server share one
(`default_server`); those that kill or stop it start their own (`start_default_server`)."""

from __future__ import annotations

import pytest

from tests.entrypoints.server_process import ServerProcess

MAX_NUM_SEQS = 48
# Room for every load test's clients to queue: load tests expect no 429, overload tests do.
MAX_QUEUED_REQUESTS = 48
SERVER_ARGS = ["--max-num-seqs", str(MAX_NUM_SEQS), "--max-queued-requests",
               str(MAX_QUEUED_REQUESTS), "--cpu-kv-cache-gib", "0.25"]


def start_default_server(*extra: str) -> ServerProcess:
    # A fresh machine fetches the model (~93 MB) first, hence the generous start-up bound.
    return ServerProcess([*SERVER_ARGS, *extra]).start(timeout_s=900)


@pytest.fixture(scope="session")
def default_server() -> ServerProcess:
    server = start_default_server()
    yield server
    server.stop()


def pytest_collection_modifyitems(config, items):
    """Every reliability test runs a default-model server of its own or shares one that takes
    minutes of load: all are `slow` (CI runs them; a local `make test` skips them)."""
    for item in items:
        if "tests/reliability/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.slow)
