"""`ladle serve --disaggregate 2P1D` and `1P2D` on the CPU with the official openai client:
greedy streams equal the offline engine's; requests arriving together spread over the prefill
engines (2P1D) and the decode engines (1P2D); a killed prefill engine of 2P1D leaves the server
answering through the other, /health degraded until it is back, and no KV block held on any
engine once the requests end."""

from __future__ import annotations

import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from ladle import SamplingParams
from tests.entrypoints.conftest import API_KEY, SERVED_NAME, TINY_ENGINE_ARGS
from tests.entrypoints.server_process import (
    ServerProcess,
    engine_is_idle,
    read_metrics,
    wait_until,
)

PROMPTS = ["The quick brown fox", "Hello, world! Hello, world! Hello,", "abc def ghi jkl mno",
           "One two three four five six", "a b c d e f g h i j k l m n o p"]
MAX_TOKENS = 12
ANNOUNCE = re.compile(r"\[ladle\] disaggregated \d+P\d+D: (.*)")


def start_server(tiny_model_path, layout: str) -> ServerProcess:
    return ServerProcess(
        [tiny_model_path("llama"), "--served-model-name", SERVED_NAME, *TINY_ENGINE_ARGS,
         "--disaggregate", layout],
        api_key=API_KEY,
    ).start()


@pytest.fixture(scope="module")
def server(tiny_model_path):
    server = start_server(tiny_model_path, "2P1D")
    yield server
    server.stop()


def openai_client(server) -> openai.OpenAI:
    return server.openai_client()


def engine_pids(server) -> dict[str, int]:
    """{"prefill 0": pid, ...} from the latest announcement (start, or all engines up again)."""
    engines = ANNOUNCE.findall(server.log())[-1]
    return {role: int(pid) for role, pid in re.findall(r"(\w+ \d+) in process (\d+)", engines)}


def per_engine(server, name: str) -> dict[str, float]:
    """One /metrics family by its engine label."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=10).text
    pattern = rf'^{re.escape(name)}\{{[^}}]*engine="([^"]+)"[^}}]*\}} (\S+)$'
    return {role: float(value) for role, value in re.findall(pattern, text, re.M)}


def health(server) -> httpx.Response:
    return httpx.get(f"{server.base_url}/health", timeout=10)


def offline_texts(offline_llm, prompts: list[str], max_tokens: int = MAX_TOKENS) -> list[str]:
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].text for o in offline_llm.generate(prompts, params, use_tqdm=False)]


def streamed_text(client: openai.OpenAI, prompt: str, max_tokens: int = MAX_TOKENS) -> str:
    stream = client.completions.create(
        model=SERVED_NAME, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )
    return "".join(choice.text or "" for chunk in stream for choice in chunk.choices)


def stream_together(client: openai.OpenAI, prompts: list[str]) -> list[str]:
    """The prompts sent at once, so that they are in flight together."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda prompt: streamed_text(client, prompt), prompts))


def test_2p1d_streams_equal_offline_and_spread_over_prefill_engines(server, offline_llm):
    before = per_engine(server, "ladle:engine_requests_routed_total")
    assert sorted(before) == ["decode 2", "prefill 0", "prefill 1"]
    assert stream_together(openai_client(server), PROMPTS) == offline_texts(offline_llm, PROMPTS)
    after = per_engine(server, "ladle:engine_requests_routed_total")
    for role in ("prefill 0", "prefill 1"):
        assert after[role] > before[role], (role, before, after)
    assert after["decode 2"] >= before["decode 2"] + len(PROMPTS)  # every handoff
    assert wait_until(lambda: engine_is_idle(server), 20)


def test_2p1d_killed_prefill_engine_others_keep_serving(server, offline_llm):
    client = openai_client(server)
    pids = engine_pids(server)
    [expected_long] = offline_texts(offline_llm, [PROMPTS[1]], max_tokens=60)
    stream = client.completions.create(
        model=SERVED_NAME, prompt=PROMPTS[1], max_tokens=60, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    text = next(chunks).choices[0].text  # it decodes on decode 2 now
    os.kill(pids["prefill 0"], signal.SIGKILL)
    assert wait_until(lambda: health(server).status_code == 503, 10)
    assert "degraded" in health(server).text and "prefill 0" in health(server).text
    # Degraded, the server answers new requests through the engines still up.
    expected = offline_texts(offline_llm, PROMPTS[:3])
    assert stream_together(client, PROMPTS[:3]) == expected
    text += "".join(chunk.choices[0].text for chunk in chunks)
    assert text == expected_long
    assert wait_until(lambda: health(server).status_code == 200, 120)
    restarted = engine_pids(server)
    assert restarted["prefill 0"] != pids["prefill 0"]
    assert restarted["prefill 1"] == pids["prefill 1"]
    assert per_engine(server, "ladle:engine_up") == {"prefill 0": 1, "prefill 1": 1, "decode 2": 1}
    assert read_metrics(server)["ladle:engine_alive"] == 1
    assert stream_together(client, PROMPTS[:2]) == expected[:2]
    # No block held anywhere once the requests end: each engine's pool is whole again.
    def pools_whole() -> bool:
        free = per_engine(server, "ladle:engine_kv_free_blocks")
        total = per_engine(server, "ladle:engine_kv_total_blocks")
        return len(total) == 3 and free == total

    assert wait_until(pools_whole, 20), per_engine(server, "ladle:engine_kv_free_blocks")
    assert wait_until(lambda: engine_is_idle(server), 20)


def test_1p2d_streams_equal_offline_and_spread_over_decode_engines(tiny_model_path,
                                                                   offline_llm):
    server = start_server(tiny_model_path, "1P2D")
    try:
        assert sorted(engine_pids(server)) == ["decode 1", "decode 2", "prefill 0"]
        texts = stream_together(openai_client(server), PROMPTS)
        assert texts == offline_texts(offline_llm, PROMPTS)
        routed = per_engine(server, "ladle:engine_requests_routed_total")
        assert routed["decode 1"] > 0 and routed["decode 2"] > 0, routed
        assert routed["prefill 0"] >= len(PROMPTS)
        assert wait_until(lambda: engine_is_idle(server), 20)
    finally:
        server.stop()
