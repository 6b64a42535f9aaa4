"""Streamed tool calls, per parser and tool_choice mode, without a server (issue 32): one delta
per step, the call's id, type and name first, then its arguments as they are written, and the
reassembled stream equal to the whole reply."""

from __future__ import annotations

import json

import pytest

from ladle.entrypoints.openai.chat_reply import ReplyShaper
from ladle.entrypoints.openai.reasoning_parsers import ThinkReasoningParser
from ladle.entrypoints.openai.tool_calling import ToolPlan
from ladle.entrypoints.openai.tool_parsers import (
    HermesToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
)

NAMES = {"get_weather", "add"}
WEATHER = '{"city": "Oslo", "unit": "celsius"}'
ADD = '{"a": 12, "b": -3}'


def _plan(mode: str, parser=None) -> ToolPlan:
    if mode == "named":
        return ToolPlan(mode="named", tool_names={"get_weather"}, named_function="get_weather")
    return ToolPlan(mode=mode, parser=parser, tool_names=NAMES)


CASES = {
    "hermes": (
        _plan("auto", HermesToolParser()),
        f'Checking.\n<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>'
        f'\n<tool_call>\n{{"name": "add", "arguments": {ADD}}}\n</tool_call>',
        [("get_weather", WEATHER), ("add", ADD)],
    ),
    "llama3_json": (
        _plan("auto", Llama3JsonToolParser()),
        f'<|python_tag|>{{"name": "get_weather", "parameters": {WEATHER}}}; '
        f'{{"name": "add", "parameters": {ADD}}}',
        [("get_weather", WEATHER), ("add", ADD)],
    ),
    "mistral": (
        _plan("auto", MistralToolParser()),
        f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {WEATHER}}}, '
        f'{{"name": "add", "arguments": {ADD}}}]',
        [("get_weather", WEATHER), ("add", ADD)],
    ),
    "mistral_args_form": (
        _plan("auto", MistralToolParser()),
        f"[TOOL_CALLS]get_weather[ARGS]{WEATHER}[TOOL_CALLS]add[ARGS]{ADD}",
        [("get_weather", WEATHER), ("add", ADD)],
    ),
    "required": (
        _plan("required"),
        f'[{{"name": "get_weather", "parameters": {WEATHER}}}, '
        f'{{"name": "add", "parameters": {ADD}}}]',
        [("get_weather", WEATHER), ("add", ADD)],
    ),
    "named": (_plan("named"), WEATHER, [("get_weather", WEATHER)]),
}


def _feed_all(shaper: ReplyShaper, text: str, step: int) -> list:
    stream = shaper.stream()
    pieces = [text[i : i + step] for i in range(0, len(text), step)] or [""]
    deltas = [stream.feed(piece, final=i == len(pieces) - 1) for i, piece in enumerate(pieces)]
    return deltas, stream


def _reassemble(deltas) -> tuple[str, str, list[dict]]:
    reasoning, content, calls = "", "", {}
    for delta in deltas:
        if delta is None:
            continue
        reasoning += delta.reasoning_content or ""
        content += delta.content or ""
        indices = [call.index for call in delta.tool_calls or []]
        assert len(indices) == len(set(indices)), "one entry per call in a delta"
        for call in delta.tool_calls or []:
            if call.index not in calls:
                # A call opens with its id, type and name (the openai SDK builds it from these).
                assert call.id.startswith("call_") and call.type == "function"
                assert call.function.name and call.index == len(calls)
                calls[call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
            else:
                assert call.id is None and call.function.name is None
            calls[call.index]["arguments"] += call.function.arguments or ""
    return reasoning, content, [calls[index] for index in sorted(calls)]


@pytest.mark.parametrize("step", [1, 3, 10_000])
@pytest.mark.parametrize("case", list(CASES))
def test_calls_stream_incrementally_and_reassemble_to_the_whole_reply(case, step):
    plan, text, expected = CASES[case]
    shaper = ReplyShaper(plan)
    message, finish = shaper.whole(text, "stop")
    assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == expected
    # A named tool_choice ends with "stop", as OpenAI and vLLM end it.
    expected_finish = "stop" if plan.mode == "named" else "tool_calls"
    assert finish == expected_finish
    deltas, stream = _feed_all(shaper, text, step)
    _, content, calls = _reassemble(deltas)
    assert [(c["name"], c["arguments"]) for c in calls] == expected
    assert all(json.loads(c["arguments"]) for c in calls)
    assert content.strip() == (message.content or "")
    assert stream.finish_reason("stop") == expected_finish
    if step == 1:
        # Incremental: the first call's arguments arrive over many steps, and its name before
        # its arguments are complete (not in one piece at the end of the request).
        fragments = [
            call.function.arguments
            for delta in deltas if delta is not None
            for call in delta.tool_calls or [] if call.index == 0 and call.function.arguments
        ]
        assert len(fragments) >= len(WEATHER) // 2
        first_call_at = next(i for i, d in enumerate(deltas) if d is not None and d.tool_calls)
        assert first_call_at < text.index(WEATHER) + 1


def test_reasoning_content_and_a_call_in_one_step_are_one_delta():
    shaper = ReplyShaper(_plan("auto", HermesToolParser()), ThinkReasoningParser())
    text = (f'<think>Weather needed.</think>\n\nSure.<tool_call>{{"name": "get_weather", '
            f'"arguments": {WEATHER}}}</tool_call>')
    delta = shaper.stream().feed(text, final=True)
    assert delta.reasoning_content == "Weather needed."
    assert delta.content == "Sure."
    [call] = delta.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", WEATHER)


@pytest.mark.parametrize("step", [1, 4])
def test_a_call_naming_no_tool_streams_as_content(step):
    shaper = ReplyShaper(_plan("auto", HermesToolParser()))
    text = '<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>'
    deltas, stream = _feed_all(shaper, text, step)
    _, content, calls = _reassemble(deltas)
    assert (content, calls) == (text, [])
    assert shaper.whole(text, "stop")[0].content == text
    assert stream.finish_reason("stop") == "stop"


@pytest.mark.parametrize("case", ["hermes", "required", "named"])
def test_a_call_cut_off_by_max_tokens_stays_a_call_in_the_stream(case):
    """A stream cannot take back the call it began: it ends with the partial arguments and
    finish_reason "length"; the whole reply returns the unfinished text as content."""
    plan, text, _ = CASES[case]
    cut = text[: text.index(WEATHER) + 9]
    shaper = ReplyShaper(plan)
    deltas, stream = _feed_all(shaper, cut, 1)
    _, _, calls = _reassemble(deltas)
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", WEATHER[:9])]
    assert stream.finish_reason("length") == "length"
    message, finish = shaper.whole(cut, "length")
    assert (message.tool_calls, finish) == ([], "length")
    assert message.content == cut


def test_arguments_written_as_a_json_string_are_decoded():
    shaper = ReplyShaper(_plan("auto", HermesToolParser()))
    text = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
    deltas, _ = _feed_all(shaper, text, 2)
    _, _, calls = _reassemble(deltas)
    assert [(c["name"], c["arguments"]) for c in calls] == [("add", '{"a": 1}')]
    assert shaper.whole(text, "stop")[0].tool_calls[0].function.arguments == '{"a": 1}'
