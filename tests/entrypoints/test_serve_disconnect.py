"""Clients that leave, streaming or not, have their requests aborted in the engine (their KV
blocks freed) while the other requests finish."""

from __future__ import annotations

import asyncio

import httpx

from tests.entrypoints.conftest import SERVED_NAME
from tests.entrypoints.server_process import engine_is_idle, read_metrics, wait_until

# Long enough that a request not aborted would still be running when we look.
LONG = {"max_tokens": 450, "ignore_eos": True, "temperature": 0}
NUM_DROPPED_STREAMS = 4


def chat_body(**fields) -> dict:
    return {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Tell me a story"}],
            **fields}


async def drop_stream_after(base_url: str, headers: dict, num_chunks: int) -> None:
    async with (
        httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60) as client,
        client.stream(
            "POST", "/v1/chat/completions", json=chat_body(stream=True, **LONG)
        ) as response,
    ):
        assert response.status_code == 200
        seen = 0
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen >= num_chunks:
                    break
    # Leaving both blocks closes the connection mid-stream.


async def drop_non_streaming(base_url: str, headers: dict) -> None:
    # The client leaves early: the CPU path now generates the 450 tokens of the tiny model in
    # well under half a second, while a loopback request reaches the engine in milliseconds.
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=0.15) as client:
        try:
            await client.post("/v1/chat/completions", json=chat_body(**LONG))
        except httpx.TimeoutException:
            return
    raise AssertionError("the long request finished before the client left")


async def finish_normally(base_url: str, headers: dict) -> str:
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as client:
        response = await client.post(
            "/v1/chat/completions", json=chat_body(max_tokens=40, ignore_eos=True)
        )
        assert response.status_code == 200
        return response.json()["choices"][0]["finish_reason"]


async def scenario(base_url: str, headers: dict) -> list:
    return await asyncio.gather(
        *(drop_stream_after(base_url, headers, 3) for _ in range(NUM_DROPPED_STREAMS)),
        drop_non_streaming(base_url, headers),
        *(finish_normally(base_url, headers) for _ in range(4)),
    )


def test_disconnects_abort_in_the_engine(tiny_server):
    before = read_metrics(tiny_server)
    results = asyncio.run(scenario(tiny_server.base_url, tiny_server.headers()))
    assert results[-4:] == ["length"] * 4  # the others finished
    # The dropped requests asked for 450 tokens each; only aborts free the engine this soon.
    assert wait_until(lambda: engine_is_idle(tiny_server), timeout_s=3)
    after = read_metrics(tiny_server)
    num_aborted = after["ladle:requests_aborted_total"] - before.get(
        "ladle:requests_aborted_total", 0
    )
    assert num_aborted == NUM_DROPPED_STREAMS + 1
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < (NUM_DROPPED_STREAMS + 1) * 450
