"""Load: 64 concurrent streaming clients send 500 requests of mixed lengths. Every request
completes, greedy outputs equal the offline LLM's, and afterwards the engine is idle (nothing
running or waiting, every KV block free), as /metrics reports it."""

from __future__ import annotations

import asyncio
import random
import time

import openai
import pytest

from ladle import SamplingParams
from tests.entrypoints.conftest import API_KEY, SERVED_NAME
from tests.entrypoints.server_process import engine_is_idle, read_metrics, wait_until

NUM_REQUESTS = 500
NUM_CLIENTS = 64
NUM_DISTINCT = 40
WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "engine",
    "serves", "many", "people", "at", "once", "one", "token", "time", "paged", "cache", "blocks",
    "return", "to", "pool",
]


def make_workload(seed: int = 0) -> list[tuple[str, str, int]]:
    """(kind, text, max_tokens) for NUM_DISTINCT distinct requests of mixed lengths."""
    rng = random.Random(seed)
    workload = []
    for index in range(NUM_DISTINCT):
        num_words = rng.choice([1, 2, 5, 12, 30, 60, 120])
        text = " ".join(rng.choice(WORDS) for _ in range(num_words))
        max_tokens = rng.choice([1, 2, 4, 8, 16, 32])
        workload.append(("chat" if index % 3 == 0 else "completion", text, max_tokens))
    return workload


def offline_texts(llm, workload) -> list[str]:
    texts = []
    for kind, text, max_tokens in workload:
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        if kind == "chat":
            output = llm.chat([[{"role": "user", "content": text}]], params, use_tqdm=False)[0]
        else:
            output = llm.generate([text], params, use_tqdm=False)[0]
        texts.append(output.outputs[0].text)
    return texts


async def run_load(base_url: str, workload) -> list[tuple[int, str, str | None]]:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, max_retries=0,
                                timeout=300)
    rng = random.Random(1)
    jobs: asyncio.Queue = asyncio.Queue()
    for _ in range(NUM_REQUESTS):
        jobs.put_nowait(rng.randrange(len(workload)))
    results = []

    async def one(index: int) -> tuple[int, str, str | None]:
        kind, text, max_tokens = workload[index]
        if kind == "chat":
            stream = await client.chat.completions.create(
                model=SERVED_NAME, messages=[{"role": "user", "content": text}],
                max_tokens=max_tokens, temperature=0, stream=True,
            )
        else:
            stream = await client.completions.create(
                model=SERVED_NAME, prompt=text, max_tokens=max_tokens, temperature=0,
                stream=True,
            )
        pieces, finish_reason = [], None
        async for chunk in stream:
            for choice in chunk.choices:
                pieces.append((choice.delta.content if kind == "chat" else choice.text) or "")
                finish_reason = choice.finish_reason or finish_reason
        return index, "".join(pieces), finish_reason

    async def worker() -> None:
        while not jobs.empty():
            results.append(await one(jobs.get_nowait()))

    await asyncio.gather(*(worker() for _ in range(NUM_CLIENTS)))
    await client.close()
    return results


@pytest.mark.slow  # ~75 s of load
def test_load_500_requests_64_clients(tiny_server, offline_llm):
    workload = make_workload()
    expected = offline_texts(offline_llm, workload)
    before = read_metrics(tiny_server)
    started = time.monotonic()
    results = asyncio.run(run_load(tiny_server.base_url, workload))
    elapsed = time.monotonic() - started
    print(f"\n{NUM_REQUESTS} requests, {NUM_CLIENTS} clients: {elapsed:.1f}s")
    assert len(results) == NUM_REQUESTS
    for index, text, finish_reason in results:
        assert finish_reason in ("stop", "length")
        assert text == expected[index], workload[index]
    assert wait_until(lambda: engine_is_idle(tiny_server), timeout_s=5)
    after = read_metrics(tiny_server)
    assert after["vllm:request_success_total"] - before.get("vllm:request_success_total", 0) >= (
        NUM_REQUESTS
    )
    assert after["vllm:prefix_cache_hits_total"] > 0  # the same prompts came back many times
    assert after["vllm:time_to_first_token_seconds_count"] > before[
        "vllm:time_to_first_token_seconds_count"
    ]
