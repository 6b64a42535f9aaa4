"""Fixtures for the server tests: one real server on the tiny llama model for the whole
session (most tests share it), and the offline LLM on the same model for parity checks."""

from __future__ import annotations

import pytest

from tests.entrypoints.server_process import ServerProcess

API_KEY = "test-key-123"
SERVED_NAME = "tiny"
# The engine options the shared server and the offline reference both run with.
TINY_ENGINE_ARGS = ["--cpu-kv-cache-gib", "0.05", "--max-num-seqs", "64", "--block-size", "16"]
TINY_ENGINE_OPTIONS = {"cpu_kv_cache_gib": 0.05, "max_num_seqs": 64, "block_size": 16}


@pytest.fixture(scope="session")
def tiny_server(tiny_model_path) -> ServerProcess:
    server = ServerProcess(
        [tiny_model_path("llama"), "--served-model-name", SERVED_NAME, *TINY_ENGINE_ARGS],
        api_key=API_KEY,
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def offline_llm(tiny_model_path):
    from ladle import LLM

    return LLM(tiny_model_path("llama"), **TINY_ENGINE_OPTIONS)


@pytest.fixture()
def openai_client(tiny_server):
    import openai

    return openai.OpenAI(
        base_url=f"{tiny_server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=60
    )
