"""Bad input gets a 4xx in OpenAI's error format, never a 5xx, and the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.entrypoints.conftest import SERVED_NAME

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields) -> bytes:
    body = {"model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 4, **fields}
    return json.dumps(body).encode()


def completion(**fields) -> bytes:
    return json.dumps({"model": SERVED_NAME, "prompt": "hi", "max_tokens": 4, **fields}).encode()


def without(field: str) -> bytes:
    body = {"model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 4}
    del body[field]
    return json.dumps(body).encode()


# (name, path, raw body, expected status, expected param or None)
CASES = [
    ("malformed json", CHAT_PATH, b'{"model": "tiny", "messages": [', 400, None),
    ("not an object", CHAT_PATH, b"[1, 2, 3]", 400, None),
    ("empty body", CHAT_PATH, b"", 400, None),
    ("non-utf8 bytes", CHAT_PATH, b'{"messages": [{"role": "user", "content": "\xff\xfe\xfa"}]}',
     400, None),
    ("raw binary", COMPLETIONS_PATH, bytes(range(256)) * 4, 400, None),
    ("max_tokens wrong type", CHAT_PATH, chat(max_tokens="ten"), 400, "max_tokens"),
    ("messages wrong type", CHAT_PATH, chat(messages="hello"), 400, "messages"),
    ("temperature wrong type", COMPLETIONS_PATH, completion(temperature="hot"), 400,
     "temperature"),
    ("stream wrong type", CHAT_PATH, chat(stream="yes"), 400, "stream"),
    ("missing messages", CHAT_PATH, without("messages"), 400, "messages"),
    ("missing prompt", COMPLETIONS_PATH, json.dumps({"model": SERVED_NAME}).encode(), 400,
     "prompt"),
    ("negative max_tokens", CHAT_PATH, chat(max_tokens=-5), 400, "max_tokens"),
    ("zero max_tokens", COMPLETIONS_PATH, completion(max_tokens=0), 400, "max_tokens"),
    ("huge max_tokens", CHAT_PATH, chat(max_tokens=10**9), 400, "max_tokens"),
    ("astronomic max_tokens", COMPLETIONS_PATH, completion(max_tokens=10**30), 400,
     "max_tokens"),
    ("huge max_completion_tokens", CHAT_PATH, chat(max_completion_tokens=10**6), 400,
     "max_completion_tokens"),
    ("temperature -1", CHAT_PATH, chat(temperature=-1), 400, "temperature"),
    ("top_p 2", CHAT_PATH, chat(top_p=2), 400, "top_p"),
    ("n 0", CHAT_PATH, chat(n=0), 400, "n"),
    ("n 10000", CHAT_PATH, chat(n=10000), 400, "n"),
    ("top_k -7", COMPLETIONS_PATH, completion(top_k=-7), 400, "top_k"),
    ("logprobs 100", COMPLETIONS_PATH, completion(logprobs=100), 400, "logprobs"),
    ("top_logprobs without logprobs", CHAT_PATH, chat(top_logprobs=2), 400, "top_logprobs"),
    ("seed too big", CHAT_PATH, chat(seed=2**80), 400, "seed"),
    ("unknown model", CHAT_PATH, chat(model="gpt-9"), 404, "model"),
    ("empty messages", CHAT_PATH, chat(messages=[]), 400, "messages"),
    ("invalid role", CHAT_PATH, chat(messages=[{"role": "wizard", "content": "hi"}]), 400,
     "messages.0.role"),
    ("image content", CHAT_PATH,
     chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]), 400,
     None),
    ("10k stop strings", CHAT_PATH, chat(stop=[f"s{i}" for i in range(10_000)]), 400, "stop"),
    ("70k-character stop string", CHAT_PATH, chat(stop=["a" * 70_000]), 400, "stop"),
    ("empty prompt", COMPLETIONS_PATH, completion(prompt=""), 400, "prompt"),
    ("empty prompt list", COMPLETIONS_PATH, completion(prompt=[]), 400, "prompt"),
    ("token id out of vocab", COMPLETIONS_PATH, completion(prompt=[1, 2, 10**6]), 400, "prompt"),
    ("negative token id", COMPLETIONS_PATH, completion(prompt=[-1]), 400, "prompt"),
    ("prompt too long", COMPLETIONS_PATH, completion(prompt="hello " * 2000), 400, "prompt"),
    ("logit_bias out of range", CHAT_PATH, chat(logit_bias={"5": 1000}), 400, "logit_bias"),
    ("logit_bias not a token", CHAT_PATH, chat(logit_bias={"x": 1}), 400, "logit_bias"),
    ("tool without a name", CHAT_PATH, chat(tools=[{"type": "function", "function": {}}]), 400,
     "tools.0.function.name"),
    ("reserved template kwarg", CHAT_PATH, chat(chat_template_kwargs={"tokenize": True}), 400,
     "chat_template_kwargs"),
    # Issue 7: each of these once reached the engine (int32 packing, int64 IPC) and killed it or
    # answered 500.
    ("top_k beyond int32", COMPLETIONS_PATH, completion(top_k=2**31), 400, "top_k"),
    ("top_k beyond int64", COMPLETIONS_PATH, completion(top_k=2**64), 400, "top_k"),
    ("top_k beyond the vocabulary", COMPLETIONS_PATH, completion(top_k=10**6), 400, None),
    ("priority beyond int64", COMPLETIONS_PATH, completion(priority=2**64), 400, "priority"),
    ("seed beyond int64", COMPLETIONS_PATH, completion(seed=2**63), 400, "seed"),
    ("stop token id beyond int64", CHAT_PATH, chat(stop_token_ids=[2**64]), 400,
     "stop_token_ids.0"),
    ("min_tokens beyond int32", CHAT_PATH, chat(min_tokens=2**31), 400, "min_tokens"),
    ("10 MB body", CHAT_PATH, chat(messages=[{"role": "user", "content": "x" * 10_000_000}]), 413,
     None),
]


@pytest.fixture(scope="module")
def client(tiny_server):
    with httpx.Client(base_url=tiny_server.base_url, headers=tiny_server.headers(),
                      timeout=60) as client:
        yield client


def assert_openai_error(response: httpx.Response, status: int, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    assert set(error) == {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param, error


def assert_still_serving(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    response = client.post(CHAT_PATH, content=chat(max_tokens=2))
    assert response.status_code == 200
    assert response.json()["choices"][0]["finish_reason"] in ("length", "stop")


@pytest.mark.parametrize(("name", "path", "body", "status", "param"), CASES,
                         ids=[case[0] for case in CASES])
def test_bad_input_is_4xx(client, name, path, body, status, param):
    response = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert_openai_error(response, status, param)
    if name.startswith(("huge max", "prompt too long")):
        assert "max_model_len" in response.json()["error"]["message"]


def test_bad_input_streaming_is_4xx_before_the_stream(client):
    response = client.post(CHAT_PATH, content=chat(stream=True, temperature=-1))
    assert_openai_error(response, 400, "temperature")


def test_chunked_body_over_the_limit_is_413(client):
    def chunks():
        for _ in range(10):
            yield b"x" * 1_000_000

    response = client.post(CHAT_PATH, content=chunks())
    assert_openai_error(response, 413, None)


def test_unknown_route_and_method(client):
    assert_openai_error(client.get("/v1/nothing"), 404, None)
    assert_openai_error(client.get(CHAT_PATH), 405, None)


def test_still_serving_after_all_that(client):
    assert_still_serving(client)


def test_out_of_range_fields_leave_the_engine_alive(client, tiny_server):
    """The request that once killed the engine for everyone: a 400, the same engine serves on."""
    engine_pid = tiny_server.engine_pid
    for body in (completion(top_k=2**31), completion(top_k=2**64), completion(priority=2**64)):
        assert client.post(COMPLETIONS_PATH, content=body).status_code == 400
    assert_still_serving(client)
    assert tiny_server.engine_pid == engine_pid


def test_long_stop_strings_do_not_stall_the_server(client):
    """Just under the cap, with n=4: the stop checker's cost is linear, so the event loop stays
    responsive (a table of every prefix once took seconds and gigabytes here)."""
    import time

    started = time.perf_counter()
    response = client.post(CHAT_PATH, content=chat(stop=["a" * 60_000], n=4))
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 4
    assert time.perf_counter() - started < 10
    assert_still_serving(client)
