"""A reasoning model served by `ladle serve`, through the openai client: the <think> parser is
chosen from the chat template, `chat_template_kwargs={"enable_thinking": false}` reaches the
template, and a JSON schema constrains the answer, never the reasoning; return_token_ids gives
the raw generated ids whatever the parser made of their text.

A tiny random Qwen3 whose ChatML template thinks like Qwen3's (the generation prompt opens a
<think> block, or writes an empty closed one when enable_thinking is false). Random weights
never write </think>, so with thinking on the whole reply is unconstrained reasoning.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from helpers.tiny_models import CHATML_TEMPLATE, save_tiny_model

from tests.entrypoints.server_process import ServerProcess

THINKING_TEMPLATE = CHATML_TEMPLATE.replace(
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}{% endif %}",
)
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}
MESSAGES = [{"role": "user", "content": "Answer in JSON."}]


@pytest.fixture(scope="module")
def thinking_tokenizer(tmp_path_factory):
    """The tiny thinking model's tokenizer, saved with its model."""
    from transformers import AutoTokenizer

    path = save_tiny_model(tmp_path_factory.mktemp("thinking"), "qwen3")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = THINKING_TEMPLATE
    tokenizer.save_pretrained(path)
    return tokenizer


@pytest.fixture(scope="module")
def client(thinking_tokenizer):
    path = thinking_tokenizer.name_or_path
    server = ServerProcess([path, "--served-model-name", "tiny"]).start()
    try:
        yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                            timeout=120)
    finally:
        server.stop()


def _chat(client, **kwargs):
    return client.chat.completions.create(
        model="tiny", messages=MESSAGES, temperature=0, max_tokens=24,
        response_format=RESPONSE_FORMAT, **kwargs,
    )


def test_thinking_off_constrains_the_answer_from_its_first_token(client):
    reply = _chat(client, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "stop"
    assert getattr(message, "reasoning_content", None) is None
    jsonschema.validate(json.loads(message.content), SCHEMA)


def test_thinking_on_leaves_the_reasoning_unconstrained_and_streams_the_same(client):
    reply = _chat(client)
    message = reply.choices[0].message
    reasoning = getattr(message, "reasoning_content", None)
    # All reasoning (no </think> came): the schema, which starts the answer with "{", was not
    # applied to it, and there is no answer yet.
    assert reasoning and not reasoning.lstrip().startswith("{")
    assert message.content is None and reply.choices[0].finish_reason == "length"
    streamed_reasoning, streamed_content = "", ""
    for chunk in _chat(client, stream=True):
        for choice in chunk.choices:
            streamed_reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            streamed_content += choice.delta.content or ""
    assert (streamed_reasoning, streamed_content) == (reasoning, "")


def test_streamed_reasoning_and_tool_calls_keep_one_entry_per_chunk(client):
    """Issue 32: reasoning deltas, and a named tool call after an empty reasoning block, read
    with the raw SSE reader that checks every chunk's shape."""
    from tests.entrypoints.sse_reader import read_chat_stream, reassemble

    base_url = str(client.base_url).removesuffix("/v1/")
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"], "additionalProperties": False}}}
    body = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 24,
            "tools": [tool], "truncate_prompt_tokens": 200,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    thinking = reassemble(read_chat_stream(base_url, body))
    assert thinking["reasoning_content"] and thinking["finish_reason"] == "length"
    assert thinking["content"] == "" and thinking["tool_calls"] == []
    body["chat_template_kwargs"] = {"enable_thinking": False}
    body["max_tokens"] = 40
    chunks = read_chat_stream(base_url, body)
    called = reassemble(chunks)
    # A named tool_choice ends with "stop", as OpenAI and vLLM end it.
    assert called["reasoning_content"] == "" and called["finish_reason"] == "stop"
    [call] = called["tool_calls"]
    assert call["name"] == "get_weather" and "city" in json.loads(call["arguments"])
    assert sum(1 for chunk in chunks for choice in chunk["choices"]
               if choice["delta"].get("tool_calls")) >= 3


def test_return_token_ids_are_the_raw_ids_whatever_the_parser_made(client, thinking_tokenizer):
    """vLLM's return_token_ids under the <think> parser: the ids decode to the reasoning the
    parser split off (the whole reply: no </think> came), the prompt's are the template's own
    rendering, and a stream's ids add up to the whole reply's."""
    from tests.entrypoints.sse_reader import read_chat_stream, reassemble

    reply = _chat(client, extra_body={"return_token_ids": True})
    [choice] = reply.choices
    assert reply.prompt_token_ids == list(thinking_tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    ))
    assert choice.message.content is None and len(choice.token_ids) == 24
    assert thinking_tokenizer.decode(choice.token_ids) == choice.message.reasoning_content
    assert reply.usage.completion_tokens == len(choice.token_ids)
    base_url = str(client.base_url).removesuffix("/v1/")
    body = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 24,
            "response_format": RESPONSE_FORMAT, "return_token_ids": True}
    assert reassemble(read_chat_stream(base_url, body))["token_ids"] == choice.token_ids
