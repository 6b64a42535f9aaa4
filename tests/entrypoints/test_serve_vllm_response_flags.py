"""vLLM's `serve` flags that shape responses, against a real `ladle serve` (one server for the
module, with all four flags): --response-role (the reply's role; the last message's when the
reply continues it), --return-tokens-as-token-ids (logprobs name tokens `token_id:N`; also the
request field, checked on the shared server without the flag), --override-generation-config
(sampling defaults over the model's; max_new_tokens the most a request generates) and
--enable-request-id-headers (X-Request-Id echoed, else generated). Bad values fail at start-up
naming the flag; --replicas refuses the header flag by name."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest

from ladle.model.generation_defaults import sampling_defaults_of
from tests.entrypoints.conftest import API_KEY, TINY_ENGINE_ARGS
from tests.entrypoints.server_process import ServerProcess

SERVED = "tiny"
ROLE = "responder"
OVERRIDES = {"temperature": 0, "max_new_tokens": 5}
HI = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def server(tiny_model_path):
    args = [
        tiny_model_path("llama"), "--served-model-name", SERVED, *TINY_ENGINE_ARGS,
        "--response-role", ROLE, "--return-tokens-as-token-ids",
        "--override-generation-config", json.dumps(OVERRIDES), "--enable-request-id-headers",
    ]  # fmt: skip
    with ServerProcess(args, api_key=API_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, headers=server.headers(), timeout=60) as http:
        yield http


# ----- --response-role ---------------------------------------------------------------------------


def test_reply_role_is_the_flag_streamed_and_not(client) -> None:
    reply = client.chat.completions.create(model=SERVED, messages=HI, max_tokens=2)
    assert reply.choices[0].message.role == ROLE
    chunks = list(client.chat.completions.create(
        model=SERVED, messages=HI, max_tokens=2, stream=True, n=2
    ))
    openings = [c.choices[0].delta for c in chunks[:2]]
    assert [d.role for d in openings] == [ROLE, ROLE]
    # only the opening delta of each choice names the role
    assert all(c.choices[0].delta.role is None for c in chunks[2:] if c.choices)


def test_a_continued_message_keeps_its_own_role(client) -> None:
    """As vLLM: without a generation prompt the reply continues the last message, whose role
    it takes (continue_final_message's assistant turn; a user turn alike)."""
    for last_role in ("assistant", "user"):
        messages = [*HI, {"role": last_role, "content": "Well"}] if last_role == "assistant" \
            else HI
        extra = {"add_generation_prompt": False}
        if last_role == "assistant":
            extra["continue_final_message"] = True
        reply = client.chat.completions.create(
            model=SERVED, messages=messages, max_tokens=2, extra_body=extra
        )
        assert reply.choices[0].message.role == last_role
        first = next(iter(client.chat.completions.create(
            model=SERVED, messages=messages, max_tokens=2, stream=True, extra_body=extra
        )))
        assert first.choices[0].delta.role == last_role


# ----- --return-tokens-as-token-ids --------------------------------------------------------------


def _label_ids(labels) -> list[int]:
    ids = []
    for label in labels:
        match = re.fullmatch(r"token_id:(\d+)", label)
        assert match, label
        ids.append(int(match.group(1)))
    return ids


def test_completion_logprobs_name_token_ids(client, tiny_tokenizer) -> None:
    completion = client.completions.create(
        model=SERVED, prompt="hello", max_tokens=4, logprobs=2,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = completion.choices[0]
    ids = _label_ids(choice.logprobs.tokens)
    assert ids == choice.token_ids  # the labels are the generated ids
    for position, top in enumerate(choice.logprobs.top_logprobs):
        assert f"token_id:{ids[position]}" in top
        _label_ids(top)
    # text offsets still count in the text: each token advances them by its decoded length
    lengths = [len(tiny_tokenizer.decode([token_id])) for token_id in ids]
    offsets = choice.logprobs.text_offset
    assert [b - a for a, b in zip(offsets, offsets[1:])] == lengths[:-1]
    streamed = [
        token
        for chunk in client.completions.create(
            model=SERVED, prompt="hello", max_tokens=4, logprobs=2, stream=True,
            extra_body={"ignore_eos": True},
        )
        if chunk.choices and chunk.choices[0].logprobs
        for token in chunk.choices[0].logprobs.tokens
    ]
    assert streamed == choice.logprobs.tokens  # greedy (the override's temperature 0)


def test_chat_logprobs_name_token_ids(client) -> None:
    reply = client.chat.completions.create(
        model=SERVED, messages=HI, max_tokens=4, logprobs=True, top_logprobs=2,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = reply.choices[0]
    content = choice.logprobs.content
    assert _label_ids([entry.token for entry in content]) == choice.token_ids
    for entry in content:
        assert entry.bytes == list(entry.token.encode())  # vLLM: the bytes of the field
        assert len(entry.top_logprobs) == 2
        _label_ids([top.token for top in entry.top_logprobs])
    streamed = [
        entry.token
        for chunk in client.chat.completions.create(
            model=SERVED, messages=HI, max_tokens=4, logprobs=True, stream=True,
            extra_body={"ignore_eos": True},
        )
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert streamed == [entry.token for entry in content]


@pytest.mark.parametrize("stream", [False, True])
def test_the_request_field_names_the_tokens_by_id(tiny_server, tiny_tokenizer, stream) -> None:
    """On a server without the flag: return_tokens_as_token_ids names by id the tokens (with
    the logprobs and text offsets) that the plain response names by text."""
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "logprobs": 1,
            "temperature": 0, "ignore_eos": True, "stream": stream}
    with httpx.Client(base_url=tiny_server.base_url, headers=tiny_server.headers(),
                      timeout=60) as http:
        plain = _completion_logprobs(http, body)
        by_id = _completion_logprobs(http, {**body, "return_tokens_as_token_ids": True})
    decoded = [tiny_tokenizer.decode([token_id]) for token_id in _label_ids(by_id["tokens"])]
    assert decoded == plain["tokens"]
    assert by_id["token_logprobs"] == pytest.approx(plain["token_logprobs"])
    assert by_id["text_offset"] == plain["text_offset"]


def _completion_logprobs(http: httpx.Client, body: dict) -> dict:
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        return response.json()["choices"][0]["logprobs"]
    merged: dict[str, list] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        logprobs = json.loads(line[len("data: "):])["choices"][0]["logprobs"]
        for key in merged:
            merged[key] += (logprobs or {}).get(key, [])
    return merged


# ----- --override-generation-config ---------------------------------------------------------------


def test_overrides_set_the_defaults(client, server) -> None:
    assert "--override-generation-config: temperature=0.0, max_tokens=5" in server.log()
    # temperature 0 by default: unseeded requests agree, and agree with an explicit greedy one
    texts = {
        client.completions.create(
            model=SERVED, prompt="hello", max_tokens=5, seed=seed,
            extra_body={"ignore_eos": True},
        ).choices[0].text
        for seed in (1, 2, 3)
    }
    greedy = client.completions.create(
        model=SERVED, prompt="hello", max_tokens=5, temperature=0,
        extra_body={"ignore_eos": True},
    ).choices[0].text
    assert texts == {greedy}
    # a request's own temperature still wins: sampled at 1.0, seeds differ
    sampled = {
        client.completions.create(
            model=SERVED, prompt="hello", max_tokens=5, seed=seed, temperature=1.0,
            extra_body={"ignore_eos": True},
        ).choices[0].text
        for seed in (1, 2, 3)
    }
    assert len(sampled) > 1


def test_max_new_tokens_is_the_most_a_request_generates(client) -> None:
    """vLLM's reading: the default of a chat request without max_tokens, and a ceiling on the
    ones that ask more; a request asking fewer keeps its own."""
    for asked, generated in ((None, 5), (50, 5), (3, 3)):
        reply = client.chat.completions.create(
            model=SERVED, messages=HI, max_tokens=asked, extra_body={"ignore_eos": True}
        )
        assert reply.usage.completion_tokens == generated, asked
        assert reply.choices[0].finish_reason == "length"
    completion = client.completions.create(
        model=SERVED, prompt="hello", extra_body={"ignore_eos": True}
    )  # OpenAI's default of 16, under the ceiling of 5
    assert completion.usage.completion_tokens == 5


def test_overrides_apply_over_any_generation_config() -> None:
    defaults = sampling_defaults_of(None, "vllm", {"top_k": 7, "max_new_tokens": 9, "min_p": None})
    assert defaults == {"top_k": 7, "max_tokens": 9}
    assert sampling_defaults_of(None, "auto", {}) == {}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{not json", "--override-generation-config"),
        ('["temperature"]', "--override-generation-config"),
        ('{"temprature": 0.5}', "unknown key 'temprature'"),
        ('{"max_new_tokens": 1.5}', "max_new_tokens must be an integer"),
        ('{"temperature": -1}', "temperature must be"),
    ],
)
def test_bad_overrides_fail_at_start_up_naming_the_flag(value, message) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ladle.cli", "serve", "tiny-llama", "--load-format", "dummy",
         "--override-generation-config", value, "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode != 0
    assert "--override-generation-config" in done.stderr, done.stderr
    assert message in done.stderr, done.stderr


# ----- --enable-request-id-headers ----------------------------------------------------------------


def test_request_id_header_echoed_or_generated(http) -> None:
    body = {"model": SERVED, "prompt": "hi", "max_tokens": 2}
    given = http.post("/v1/completions", json=body, headers={"X-Request-Id": "trace-42"})
    assert given.status_code == 200
    assert given.headers["x-request-id"] == "trace-42"
    generated = [http.post("/v1/completions", json=body).headers["x-request-id"]
                 for _ in range(2)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", value) for value in generated)
    assert generated[0] != generated[1]
    with http.stream("POST", "/v1/chat/completions", headers={"X-Request-Id": "s-1"},
                     json={"model": SERVED, "messages": HI, "max_tokens": 2,
                           "stream": True}) as streamed:
        assert streamed.headers["x-request-id"] == "s-1"
        assert "[DONE]" in "".join(streamed.iter_text())
    error = http.post("/v1/completions", json={**body, "max_tokens": -1},
                      headers={"X-Request-Id": "bad-1"})
    assert error.status_code == 400 and error.headers["x-request-id"] == "bad-1"
    assert http.get("/health").headers["x-request-id"]


def test_no_request_id_header_by_default(tiny_server) -> None:
    response = httpx.get(f"{tiny_server.base_url}/health", headers={"X-Request-Id": "x"})
    assert response.status_code == 200
    assert "x-request-id" not in response.headers


def test_request_id_headers_with_ray_replicas_are_refused(tiny_model_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ladle.cli", "serve", tiny_model_path("llama"), "--replicas", "2",
         "--enable-request-id-headers", "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "--enable-request-id-headers is not supported with --replicas" in done.stderr
