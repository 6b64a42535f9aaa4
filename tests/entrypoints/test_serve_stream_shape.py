"""Streamed chat completions read the way clients read them (issue 32): a raw SSE reader checks
every chunk's shape (one entry per choice index, role first, one finish_reason, usage last), and
the openai SDK's own stream helpers rebuild the tool call. Plain text, n > 1, logprobs,
include_usage and tool calls (auto, required, named) on the session's tiny server; reasoning on
the thinking model's server (test_serve_reasoning_structured.py).

Random weights write no tool call by themselves: "required" and named calls are forced by their
grammar, and "auto" by a regex in vLLM's structured_outputs, which auto leaves free to set."""

from __future__ import annotations

import json

import httpx

from tests.entrypoints.conftest import API_KEY, SERVED_NAME
from tests.entrypoints.sse_reader import read_chat_stream, reassemble

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "user", "content": "Weather in Oslo?"}]
# The tools are described in the prompt, which is longer than the tiny model's context (512) in
# its byte-level tokens: vLLM's truncate_prompt_tokens keeps the prompt's end (random weights
# read nothing in it anyway).
TRUNCATE = {"truncate_prompt_tokens": 256}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "maximum": 999},
                           "b": {"type": "integer", "maximum": 999}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}
TOOLS = [WEATHER, ADD]
# A Hermes call the regex makes the tiny model write under tool_choice "auto".
AUTO_CALL_REGEX = (r'<tool_call>\n\{"name": "add", "arguments": \{"a": [1-9][0-9], '
                   r'"b": [1-9]\}\}\n</tool_call>')
TOOL_CHOICES = {
    "required": {"tool_choice": "required", "parallel_tool_calls": False},
    "named": {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "auto": {"tool_choice": "auto", "structured_outputs": {"regex": AUTO_CALL_REGEX}},
}


def _body(**fields) -> dict:
    return {"model": SERVED_NAME, "messages": MESSAGES, "temperature": 0, "max_tokens": 8,
            **fields}


def _whole(tiny_server, body: dict) -> dict:
    """The same request, not streamed (stream_options would be a 400 there, as in vLLM)."""
    body = {name: value for name, value in body.items() if name != "stream_options"}
    response = httpx.post(f"{tiny_server.base_url}/v1/chat/completions", json=body,
                          headers=HEADERS, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_plain_text_logprobs_and_usage_stream_in_openai_shape(tiny_server):
    body = _body(logprobs=True, top_logprobs=2, stream_options={"include_usage": True},
                 ignore_eos=True, max_tokens=6)
    chunks = read_chat_stream(tiny_server.base_url, body, HEADERS)
    message = reassemble(chunks)
    whole = _whole(tiny_server, body)["choices"][0]
    assert message["content"] == whole["message"]["content"]
    assert message["finish_reason"] == whole["finish_reason"] == "length"
    assert [entry["token"] for entry in message["logprobs"]] == [
        entry["token"] for entry in whole["logprobs"]["content"]
    ]
    assert len(message["logprobs"]) == 6
    assert chunks[-1]["usage"]["completion_tokens"] == 6


def test_n_choices_each_stream_once_per_chunk(tiny_server):
    body = _body(n=3, temperature=1.0, seed=7, max_tokens=10)
    chunks = read_chat_stream(tiny_server.base_url, body, HEADERS)
    assert any(len(chunk["choices"]) > 1 for chunk in chunks)  # the choices share chunks
    for index in range(3):
        assert reassemble(chunks, index)["finish_reason"] in ("stop", "length")


def _check_calls_stream_like_whole_replies(tiny_server, tool_choice: str, n: int = 1) -> None:
    body = _body(tools=TOOLS, max_tokens=60, n=n, **TOOL_CHOICES[tool_choice], **TRUNCATE)
    chunks = read_chat_stream(tiny_server.base_url, body, HEADERS)
    whole = _whole(tiny_server, body)
    for index in range(n):
        message = reassemble(chunks, index)
        expected = whole["choices"][index]
        # A named tool_choice ends with "stop", as OpenAI and vLLM end it.
        finish = "stop" if tool_choice == "named" else "tool_calls"
        assert message["finish_reason"] == expected["finish_reason"] == finish
        calls = [(c["name"], c["arguments"]) for c in message["tool_calls"]]
        assert calls == [(c["function"]["name"], c["function"]["arguments"])
                         for c in expected["message"]["tool_calls"]]
        assert len(calls) == 1 and isinstance(json.loads(calls[0][1]), dict)
        assert message["content"] == ""
        # The arguments arrive over several chunks, not in one piece at the end.
        fragments = [
            call for chunk in chunks for choice in chunk["choices"] if choice["index"] == index
            for call in choice["delta"].get("tool_calls") or []
            if call["function"].get("arguments")
        ]
        assert len(fragments) >= 3, fragments
        # The finish_reason comes in the chunk of the last fragment or after it, never before.
        finish_at = next(i for i, chunk in enumerate(chunks) for choice in chunk["choices"]
                         if choice["index"] == index and choice["finish_reason"])
        assert all(i <= finish_at for i, chunk in enumerate(chunks) for choice in chunk["choices"]
                   if choice["index"] == index and choice["delta"].get("tool_calls"))


def test_required_tool_call_streams_its_arguments(tiny_server):
    _check_calls_stream_like_whole_replies(tiny_server, "required")


def test_named_tool_call_streams_its_arguments(tiny_server):
    _check_calls_stream_like_whole_replies(tiny_server, "named")


def test_auto_tool_call_streams_its_arguments(tiny_server):
    _check_calls_stream_like_whole_replies(tiny_server, "auto")


def test_tool_calls_of_several_choices(tiny_server):
    _check_calls_stream_like_whole_replies(tiny_server, "required", n=2)


def test_openai_sdk_rebuilds_the_streamed_tool_call(openai_client):
    """client.chat.completions.stream(...): the SDK's helper accumulates the deltas into the
    final message and parses a strict tool's arguments; a plain stream read at choices[0]
    gives the same call."""
    kwargs = dict(model=SERVED_NAME, messages=MESSAGES, tools=TOOLS, tool_choice="required",
                  parallel_tool_calls=False, temperature=0, max_tokens=60, extra_body=TRUNCATE)
    argument_deltas = []
    with openai_client.chat.completions.stream(**kwargs) as stream:
        for event in stream:
            if event.type == "tool_calls.function.arguments.delta":
                argument_deltas.append(event.arguments_delta)
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.id.startswith("call_") and call.function.name in ("get_weather", "add")
    assert call.function.parsed_arguments == json.loads(call.function.arguments)
    assert len(argument_deltas) >= 3 and "".join(argument_deltas) == call.function.arguments

    name, arguments, finish = None, "", None
    for chunk in openai_client.chat.completions.create(stream=True, **kwargs):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta  # what most clients read
        for fragment in delta.tool_calls or []:
            name = name or fragment.function.name
            arguments += fragment.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, arguments, finish) == (call.function.name, call.function.arguments,
                                         "tool_calls")


def test_openai_sdk_streams_plain_text_with_usage(openai_client):
    text, usage = "", None
    stream = openai_client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, temperature=0, max_tokens=8, stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    whole = openai_client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, temperature=0, max_tokens=8
    )
    assert text == whole.choices[0].message.content
    assert usage.completion_tokens == whole.usage.completion_tokens
