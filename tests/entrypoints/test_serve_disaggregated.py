"""`ladle serve --disaggregate 1P1D` on the CPU with the official openai client: streamed
completions and chat equal the offline engine's, the first token once, usage and logprobs
exact, stop strings end a stream; a killed decode engine fails its requests with a reason,
/health says degraded until the engine is back, and the prefill engine is left holding no KV."""

from __future__ import annotations

import os
import re
import signal

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

PROMPTS = ["The quick brown fox", "Hello, world! Hello, world! Hello,", "abc def ghi jkl mno"]
MAX_TOKENS = 12
PIDS = re.compile(r"disaggregated 1P1D: prefill 0 in process (\d+), decode 1 in process (\d+)")


@pytest.fixture(scope="module")
def server(tiny_model_path):
    server = ServerProcess(
        [tiny_model_path("llama"), "--served-model-name", SERVED_NAME, *TINY_ENGINE_ARGS,
         "--disaggregate", "1P1D"],
        api_key=API_KEY,
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def client(server):
    return server.openai_client()


def engine_pids(server) -> tuple[int, int]:
    prefill, decode = PIDS.findall(server.log())[-1]
    return int(prefill), int(decode)


def test_streamed_completions_equal_offline(client, offline_llm):
    expected = offline_llm.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
        use_tqdm=False,
    )
    for prompt, offline in zip(PROMPTS, expected, strict=True):
        stream = client.completions.create(
            model=SERVED_NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
            logprobs=1, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
        text, usage, tokens = "", None, []
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.text or ""
                if choice.logprobs is not None and choice.logprobs.tokens:
                    tokens += choice.logprobs.tokens
        assert text == offline.outputs[0].text
        assert len(tokens) == MAX_TOKENS  # the first token (the prefill's) came once
        assert usage.completion_tokens == MAX_TOKENS
        assert usage.prompt_tokens == len(offline.prompt_token_ids)


def test_chat_and_stop_strings_equal_offline(client, offline_llm):
    conversation = [{"role": "user", "content": PROMPTS[0]}]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    expected = offline_llm.chat([conversation], params, use_tqdm=False)[0].outputs[0]
    reply = client.chat.completions.create(
        model=SERVED_NAME, messages=conversation, max_tokens=MAX_TOKENS, temperature=0
    )
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.completion_tokens == len(expected.token_ids)
    # A stop string inside the text ends it there, wherever it falls (first token or later).
    stop = expected.text[3:6] if len(expected.text) > 6 else expected.text[:1]
    stopped = client.chat.completions.create(
        model=SERVED_NAME, messages=conversation, max_tokens=MAX_TOKENS, temperature=0,
        stop=[stop],
    )
    assert stopped.choices[0].message.content == expected.text.split(stop)[0]
    assert stopped.choices[0].finish_reason == "stop"


def test_structured_output_and_seeded_samples(client, offline_llm):
    grammar = 'root ::= "The answer is " [0-9] [0-9]? "."'
    reply = client.completions.create(
        model=SERVED_NAME, prompt="Two plus two:", max_tokens=16, temperature=1.0, n=2, seed=3,
        extra_body={"structured_outputs": {"grammar": grammar}},
    )
    for choice in reply.choices:
        assert re.fullmatch(r"The answer is [0-9][0-9]?\.", choice.text), choice.text
    # Seeded sampling draws the same tokens as one engine (the decode engine continues the
    # prefill engine's random stream).
    params = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=5, ignore_eos=True)
    expected = offline_llm.generate([PROMPTS[2]], params, use_tqdm=False)[0].outputs[0].text
    reply = client.completions.create(model=SERVED_NAME, prompt=PROMPTS[2], max_tokens=MAX_TOKENS,
                                      temperature=1.0, seed=5, extra_body={"ignore_eos": True})
    assert reply.choices[0].text == expected


def test_handoffs_and_pulls_are_counted_in_metrics(server, client):
    before = read_metrics(server)
    prompt = PROMPTS[0] * 3  # a few blocks
    client.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=3, temperature=0,
                              extra_body={"ignore_eos": True})
    assert wait_until(lambda: engine_is_idle(server), 20)
    after = read_metrics(server)
    assert after["ladle:kv_handoffs_total"] == before["ladle:kv_handoffs_total"] + 1
    assert after["ladle:kv_pulls_total"] + after["ladle:kv_pulls_failed_total"] == (
        before["ladle:kv_pulls_total"] + before["ladle:kv_pulls_failed_total"] + 1
    )
    assert after["ladle:kv_pull_blocks_total"] > before["ladle:kv_pull_blocks_total"]
    assert after["ladle:kv_pull_bytes_total"] > before["ladle:kv_pull_bytes_total"]
    assert after["ladle:kv_handoffs_held"] == 0 and after["ladle:kv_handoff_blocks_held"] == 0


def test_client_disconnect_frees_kv_on_both_engines(server, client):
    stream = client.completions.create(
        model=SERVED_NAME, prompt=PROMPTS[0] * 8, max_tokens=400, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))
    stream.close()  # the client goes away mid-stream
    assert wait_until(lambda: engine_is_idle(server), 20)


def test_killed_prefill_engine_leaves_decoding_streams_whole(server, client, offline_llm):
    prefill_pid, _ = engine_pids(server)
    expected = offline_llm.generate(
        [PROMPTS[1]], SamplingParams(temperature=0, max_tokens=60, ignore_eos=True),
        use_tqdm=False,
    )[0].outputs[0].text
    stream = client.completions.create(
        model=SERVED_NAME, prompt=PROMPTS[1], max_tokens=60, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    text = next(chunks).choices[0].text
    os.kill(prefill_pid, signal.SIGKILL)
    text += "".join(chunk.choices[0].text for chunk in chunks)
    assert text == expected  # its KV was on the decode engine already
    assert wait_until(lambda: httpx.get(f"{server.base_url}/health").status_code == 200, 120)
    assert engine_pids(server)[0] != prefill_pid
    assert wait_until(lambda: engine_is_idle(server), 20)


def test_killed_decode_engine_fails_clearly_and_heals(server, client):
    _, decode_pid = engine_pids(server)
    stream = client.completions.create(
        model=SERVED_NAME, prompt=PROMPTS[0], max_tokens=200, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))  # it streams: the decode engine has it
    os.kill(decode_pid, signal.SIGKILL)
    with pytest.raises(openai.APIError):
        for _ in stream:
            pass
    assert wait_until(lambda: httpx.get(f"{server.base_url}/health").status_code == 503, 10)
    assert "degraded" in httpx.get(f"{server.base_url}/health").text
    assert wait_until(lambda: httpx.get(f"{server.base_url}/health").status_code == 200, 120)
    assert engine_pids(server)[1] != decode_pid
    reply = client.completions.create(model=SERVED_NAME, prompt=PROMPTS[1], max_tokens=4,
                                      temperature=0)
    assert reply.usage.completion_tokens == 4
    # The prefill engine holds nothing for the failed request: every block is free again.
    assert wait_until(lambda: read_metrics(server)["vllm:kv_cache_usage_perc"] == 0.0, 10)
