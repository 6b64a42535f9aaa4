"""Tool-call parsers, the <think> reasoning parser, and streamed replies that reassemble to the
whole ones (no server)."""

from __future__ import annotations

import json

import pytest

from ladle.entrypoints.openai.chat_reply import ReplyShaper
from ladle.entrypoints.openai.reasoning_parsers import ThinkReasoningParser
from ladle.entrypoints.openai.tool_calling import ToolPlan
from ladle.entrypoints.openai.tool_parsers import (
    TOOL_PARSERS,
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
    select_tool_parser,
)

NAMES = {"get_weather", "add"}


@pytest.mark.parametrize(
    ("parser", "text", "content", "calls"),
    [
        (HermesToolParser(), 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}'
         "\n</tool_call>", "Sure.", [("add", {"a": 1, "b": 2})]),
        (HermesToolParser(), '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>\n'
         '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>', None,
         [("add", {"a": 1}), ("get_weather", {"city": "Rome"})]),
        (Llama3JsonToolParser(), '{"name": "add", "parameters": {"a": 3, "b": 4}}', None,
         [("add", {"a": 3, "b": 4})]),
        (Llama3JsonToolParser(), '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; '
         '{"name": "get_weather", "parameters": {"city": "Oslo"}}', None,
         [("add", {"a": 1}), ("get_weather", {"city": "Oslo"})]),
        (MistralToolParser(), '[TOOL_CALLS][{"name": "add", "arguments": {"a": 5}}]', None,
         [("add", {"a": 5})]),
        (MistralToolParser(), '[TOOL_CALLS]get_weather[ARGS]{"city": "Lima"}', None,
         [("get_weather", {"city": "Lima"})]),
    ],
)
def test_parsers_extract_calls(parser, text, content, calls):
    got_content, got_calls = parser.extract(text, NAMES)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got_calls] == calls


@pytest.mark.parametrize(
    ("parser", "text"),
    [
        (HermesToolParser(), '<tool_call>\n{"name": "add", "arguments": {"a": 1'),  # cut off
        (HermesToolParser(), '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>'),
        (HermesToolParser(), '<tool_call>{"name": "add", "arguments": [1]}</tool_call>'),
        (HermesToolParser(), "The weather is fine."),
        (Llama3JsonToolParser(), '{"name": "add", "parameters": {"a": 1} trailing'),
        (Llama3JsonToolParser(), 'Answer: {"name": "add", "parameters": {}}'),
        (MistralToolParser(), "[TOOL_CALLS][{broken"),
    ],
)
def test_broken_or_unknown_calls_are_plain_text(parser, text):
    assert parser.extract(text, NAMES) == (text, [])


def test_parser_selection():
    assert isinstance(select_tool_parser(None, "... <tool_call> ..."), HermesToolParser)
    assert isinstance(select_tool_parser(None, "{{ '[TOOL_CALLS]' }}"), MistralToolParser)
    assert isinstance(select_tool_parser(None, "<|python_tag|> ipython"), Llama3JsonToolParser)
    assert isinstance(select_tool_parser(None, None), HermesToolParser)
    assert isinstance(select_tool_parser("mistral", None), MistralToolParser)
    with pytest.raises(ValueError, match="unknown tool call parser"):
        select_tool_parser("nope", None)
    assert set(TOOL_PARSERS) == {"hermes", "llama3_json", "mistral"}


@pytest.mark.parametrize(
    ("text", "starts_in_reasoning", "expected"),
    [
        ("<think>step 1</think>\n\nParis", False, ("step 1", "Paris")),
        ("Paris", False, (None, "Paris")),
        ("step 1</think>Paris", True, ("step 1", "Paris")),
        ("<think>still thinking", False, ("still thinking", None)),
        ("a </think> in an answer", False, (None, "a </think> in an answer")),
    ],
)
def test_think_split(text, starts_in_reasoning, expected):
    assert ThinkReasoningParser().split(text, starts_in_reasoning) == expected


def test_prompt_that_opens_a_think_block():
    assert ThinkReasoningParser.starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not ThinkReasoningParser.starts_in_reasoning("assistant\n<think>\n\n</think>\n\n")


def _stream_all(shaper: ReplyShaper, text: str, step: int):
    stream = shaper.stream()
    reasoning, content, calls = "", "", {}
    pieces = [text[i : i + step] for i in range(0, len(text), step)] or [""]
    for index, piece in enumerate(pieces):
        delta = stream.feed(piece, final=index == len(pieces) - 1)
        if delta is not None:
            reasoning += delta.reasoning_content or ""
            content += delta.content or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, ["", ""])
                if call.function is not None:
                    entry[0] += call.function.name or ""
                    entry[1] += call.function.arguments or ""
    return reasoning or None, content or None, [tuple(calls[i]) for i in sorted(calls)], stream


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
@pytest.mark.parametrize(
    "text",
    [
        'Let me check.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>',
        "<think>The user wants weather.</think>\n\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<think>no tool needed</think>Hello there, <tool friend>!",
        "Plain answer < with a bracket",
        "<think>only thinking, the budget ran out before an answer",
        "<think>thought it through</think>",
        '<tool_call>{"name": "nope", "arguments": {"a": 1}}</tool_call>',
    ],
)
def test_streamed_reply_reassembles_to_the_whole_reply(text, step):
    shaper = ReplyShaper(ToolPlan(mode="auto", parser=HermesToolParser(), tool_names=NAMES),
                         ThinkReasoningParser())
    message, finish = shaper.whole(text, "stop")
    reasoning, content, calls, stream = _stream_all(shaper, text, step)
    assert reasoning == message.reasoning_content
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == calls
    assert stream.finish_reason("stop") == finish
    if calls:
        assert finish == "tool_calls"
        assert (content or "").strip() == (message.content or "")
    else:
        assert content == message.content
