"""No field is silently ignored: every OpenAI and vLLM request field is honoured (the request
models hold it) or a 400 naming it; unknown fields are a 400 unless --allow-unknown-fields."""

from __future__ import annotations

import json

import httpx
import pytest

from ladle.entrypoints.openai.errors import BadRequestError
from ladle.entrypoints.openai.field_policy import (
    NO_OP_VALUES,
    REFUSED,
    check_request_fields,
)
from ladle.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from tests.entrypoints.conftest import SERVED_NAME

# An example value for each refused field that would change the result if honoured.
EFFECTIVE_VALUES = {
    "response_format": {"type": "json_object"},
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "functions": [{"name": "f"}],
    "tool_choice": "auto",
    "function_call": "auto",
    "parallel_tool_calls": False,
    "logit_bias": {"5": 10},
    "allowed_token_ids": [1, 2],
    "bad_words": ["x"],
    "echo": True,
    "continue_final_message": True,
    "use_beam_search": True,
    "store": True,
    "spaces_between_special_tokens": False,
    "length_penalty": 2.0,
    "modalities": ["audio"],
    "add_special_tokens": "flip",  # replaced per endpoint below
}


def effective_value(name: str, is_chat: bool):
    if name == "add_special_tokens":
        return is_chat  # chat's default is False, completions' True
    return EFFECTIVE_VALUES.get(name, "something")


@pytest.mark.parametrize("name", sorted(REFUSED))
@pytest.mark.parametrize("request_class", [ChatCompletionRequest, CompletionRequest])
def test_refused_fields_are_a_400_naming_them(name, request_class) -> None:
    is_chat = request_class is ChatCompletionRequest
    body = {"messages" if is_chat else "prompt": [], name: effective_value(name, is_chat)}
    if name in request_class.model_fields:
        # the endpoint implements it itself (completions' echo, chat's tools): honoured.
        check_request_fields(body, request_class, allow_unknown_fields=False)
        return
    with pytest.raises(BadRequestError) as info:
        check_request_fields(body, request_class, allow_unknown_fields=False)
    assert info.value.param == name
    assert name in str(info.value)


@pytest.mark.parametrize("name", sorted(NO_OP_VALUES))
def test_no_op_values_and_null_are_accepted(name) -> None:
    for value in (*NO_OP_VALUES[name], None):
        check_request_fields({name: value}, ChatCompletionRequest, allow_unknown_fields=False)


def test_unknown_fields_refused_unless_allowed() -> None:
    with pytest.raises(BadRequestError, match="unknown field 'frobnicate'"):
        check_request_fields({"frobnicate": 1}, CompletionRequest, allow_unknown_fields=False)
    check_request_fields({"frobnicate": 1}, CompletionRequest, allow_unknown_fields=True)
    check_request_fields(
        {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        CompletionRequest,
        allow_unknown_fields=False,
    )
    with pytest.raises(BadRequestError, match="stream_options.frobnicate"):
        check_request_fields(
            {"stream": True, "stream_options": {"frobnicate": True}},
            CompletionRequest,
            allow_unknown_fields=False,
        )


def test_stream_options_need_a_stream() -> None:
    """As vLLM and OpenAI: stream_options on a request that does not stream is a 400; null or
    empty options are nothing to refuse."""
    for stream in (False, None):
        with pytest.raises(BadRequestError, match="only be set when stream is true") as caught:
            check_request_fields(
                {"stream": stream, "stream_options": {"include_usage": True}},
                ChatCompletionRequest,
                allow_unknown_fields=False,
            )
        assert caught.value.param == "stream_options"
    for options in (None, {}):
        check_request_fields(
            {"stream_options": options}, ChatCompletionRequest, allow_unknown_fields=False
        )


def test_every_model_field_is_honoured_not_refused() -> None:
    # A field in a request model is honoured there even when REFUSED lists it for the other
    # endpoint (tools are chat's; echo is completions').
    for request_class in (ChatCompletionRequest, CompletionRequest):
        overlap = set(request_class.model_fields) & set(REFUSED)
        assert overlap <= {"tools", "tool_choice", "parallel_tool_calls", "echo"}, overlap


@pytest.fixture(scope="module")
def client(tiny_server):
    with httpx.Client(
        base_url=tiny_server.base_url, headers=tiny_server.headers(), timeout=60
    ) as client:
        yield client


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
        ("/v1/chat/completions", {"reasoning_effort": "low"}, "reasoning_effort"),
        ("/v1/completions", {"allowed_token_ids": [10**9]}, "allowed_token_ids"),
        ("/v1/completions", {"logit_bias": {"x": 1}}, "logit_bias"),
        ("/v1/completions", {"cache_salt": ""}, "cache_salt"),
        ("/v1/completions", {"not_a_field": 1}, "not_a_field"),
        ("/v1/completions", {"continue_final_message": True}, "continue_final_message"),
        ("/v1/chat/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
        (
            "/v1/completions",
            {"stream": True, "stream_options": {"not_an_option": True}},
            "stream_options.not_an_option",
        ),
    ],
)
def test_server_refuses_with_the_field_named(client, path, extra, param) -> None:
    base = {"model": SERVED_NAME, "max_tokens": 2}
    base.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {})
    base.update({} if "chat" in path else {"prompt": "hi"})
    response = client.post(path, content=json.dumps({**base, **extra}))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


def test_server_accepts_defaults_and_honoured_extras(client) -> None:
    body = {
        "model": SERVED_NAME,
        "prompt": "hi",
        "max_tokens": 2,
        "user": "someone",
        "tool_choice": "none",
        "logit_bias": {},
        "top_k": 1,
    }
    response = client.post("/v1/completions", content=json.dumps(body))
    assert response.status_code == 200, response.text


def test_server_honours_allowed_token_ids_and_logit_bias(client) -> None:
    base = {"model": SERVED_NAME, "prompt": "hi", "max_tokens": 4, "temperature": 1.0, "seed": 3}
    allowed = client.post(
        "/v1/completions", content=json.dumps({**base, "allowed_token_ids": [7, 9]})
    )
    assert allowed.status_code == 200, allowed.text
    forced = client.post(
        "/v1/completions", content=json.dumps({**base, "logit_bias": {"11": 100}, "logprobs": 1})
    )
    assert forced.status_code == 200, forced.text
    choice = forced.json()["choices"][0]
    assert choice["finish_reason"] == "length"
    # +100 on one token makes it the only one sampled, at every step.
    assert len(set(choice["logprobs"]["tokens"])) == 1
