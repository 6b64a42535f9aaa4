"""Request parsing, error mapping and the request -> SamplingParams rules, without a server."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from ladle.entrypoints.openai.errors import BadRequestError, from_validation_error
from ladle.entrypoints.openai.protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatStreamChoice,
    CompletionRequest,
    parse_request,
)
from ladle.entrypoints.openai.sampling import build_sampling_params, resolve_max_tokens

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def parse_error(model_class, body: bytes | dict) -> BadRequestError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ValidationError) as caught:
        parse_request(model_class, raw)
    return from_validation_error(caught.value)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "max_tokens": "ten"}, "max_tokens"),
        ({**CHAT, "n": True}, "n"),  # strict: a bool is not an integer
        ({**CHAT, "temperature": "hot"}, "temperature"),
        ({**CHAT, "stop": [1, 2]}, "stop"),
        ({**CHAT, "seed": 2**70}, "seed"),
        ({"messages": []}, "messages"),
        ({"model": "tiny"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
        ({"messages": [{"content": "hi"}]}, "messages.0.role"),
        ({"messages": "hello"}, "messages"),
    ],
)
def test_chat_shape_errors_name_the_field(body, param):
    error = parse_error(ChatCompletionRequest, body)
    assert error.status_code == 400
    assert error.param == param
    assert param.split(".")[0] in error.message


@pytest.mark.parametrize(
    "raw",
    [b'{"prompt": ', b"\xff\xfe\x00garbage", b'{"prompt": "\xff\xfe"}', b"", b"[1, 2]", b"null"],
)
def test_malformed_bodies_are_400(raw):
    error = parse_error(CompletionRequest, raw)
    assert error.status_code == 400
    body = error.body()["error"]
    assert body["type"] == "invalid_request_error" and body["message"]


def test_accepts_every_prompt_shape_and_ignores_unknown_fields():
    for prompt in ["a", ["a", "b"], [1, 2, 3], [[1, 2], [3]]]:
        request = parse_request(
            CompletionRequest, json.dumps({"prompt": prompt, "future_field": 1}).encode()
        )
        assert request.prompt == prompt
    chat = parse_request(
        ChatCompletionRequest,
        json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                              {"type": "text", "text": "b"}]}]})
        .encode(),
    )
    assert chat.messages[0].text() == "ab"


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", -1), ("top_p", 2), ("top_p", 0), ("n", 0), ("n", 10_000), ("top_k", -5),
     ("min_p", 1.5), ("presence_penalty", 3), ("repetition_penalty", 0), ("min_tokens", -1)],
)
def test_out_of_range_sampling_values_are_400_naming_the_field(field, value):
    # Ranges are checked while parsing (from the table SamplingParams follows too).
    with pytest.raises(ValidationError) as caught:
        parse_request(CompletionRequest, json.dumps({"prompt": "a", field: value}).encode())
    error = from_validation_error(caught.value)
    assert error.param == field and field in error.message


def test_too_many_stop_strings_is_400():
    request = parse_request(
        CompletionRequest, json.dumps({"prompt": "a", "stop": ["x"] * 10_000}).encode()
    )
    with pytest.raises(BadRequestError) as caught:
        build_sampling_params(request, max_tokens=4, logprobs=None)
    assert caught.value.param == "stop"


def test_logit_bias_maps_to_token_ids_and_bad_values_are_refused():
    request = parse_request(CompletionRequest, b'{"prompt": "a", "logit_bias": {"1": 5}}')
    assert build_sampling_params(request, max_tokens=4, logprobs=None).logit_bias == {1: 5.0}
    request = parse_request(CompletionRequest, b'{"prompt": "a", "logit_bias": {"1": 500}}')
    with pytest.raises(BadRequestError) as caught:
        build_sampling_params(request, max_tokens=4, logprobs=None)
    assert caught.value.param == "logit_bias"


def test_max_tokens_rules_name_the_limit():
    assert resolve_max_tokens(None, 10, 512, "prompt") == 502
    assert resolve_max_tokens(5, 10, 512, "prompt") == 5
    with pytest.raises(BadRequestError, match="max_model_len") as caught:
        resolve_max_tokens(600, 10, 512, "prompt")
    assert caught.value.param == "max_tokens"
    with pytest.raises(BadRequestError, match="max_model_len") as caught:
        resolve_max_tokens(None, 512, 512, "messages")
    assert caught.value.param == "messages"
    with pytest.raises(BadRequestError, match="at least 1"):
        resolve_max_tokens(-3, 10, 512, "prompt")
    with pytest.raises(BadRequestError, match="empty"):
        resolve_max_tokens(5, 0, 512, "prompt")
    # A KV pool smaller than the model caps max_model_len (the engine reports the capped
    # value), so a request over the pool is refused by the same rule.
    with pytest.raises(BadRequestError, match="max_model_len"):
        resolve_max_tokens(100, 10, 64, "prompt")


def test_stream_delta_sends_only_what_changed():
    chunk = ChatCompletionChunk(
        id="x", created=0, model="m",
        choices=[ChatStreamChoice(index=0, delta=ChatDelta(content="hi"))],
    )
    choice = json.loads(chunk.model_dump_json())["choices"][0]
    assert choice["delta"] == {"content": "hi"}
    assert choice["finish_reason"] is None
