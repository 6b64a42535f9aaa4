"""Shaping a chat reply's text into reasoning_content, content and tool_calls, whole or streamed.

The stream of one choice goes text -> reasoning split -> tool-call detection: content streams as
it comes until the text may be starting a tool call. From there the parser reads the calls as
they grow (tool_parsers/partial_json.py): a call begins with its id, type and name once the name
is written, then its arguments stream as the model writes them (OpenAI's and vLLM's shape). If
the text turns out to be no call (no name of a tool came), what was held goes out as content.
Each step gives one delta per choice, reasoning, content and call fragments merged.

Reassembled, a stream gives what the whole reply gives, with one exception a stream cannot
avoid: a call that breaks after it began (cut off by max_tokens, malformed JSON) stays a call in
the stream, while the whole reply returns such text as content.
"""

from __future__ import annotations

from dataclasses import dataclass

from ladle.entrypoints.openai.protocol import (
    ChatDelta,
    ChatResponseMessage,
    DeltaFunctionCall,
    DeltaToolCall,
)
from ladle.entrypoints.openai.reasoning_parsers import ThinkReasoningParser
from ladle.entrypoints.openai.reasoning_parsers.think import ThinkStream
from ladle.entrypoints.openai.tool_calling import (
    ToolPlan,
    extract_tool_calls,
    new_tool_call_id,
)


@dataclass
class ReplyShaper:
    """One request's rules for its replies."""

    plan: ToolPlan
    reasoning_parser: ThinkReasoningParser | None = None
    starts_in_reasoning: bool = False

    @property
    def is_plain(self) -> bool:
        return not self.plan.is_active and self.reasoning_parser is None

    def whole(self, text: str, finish_reason: str | None) -> tuple[ChatResponseMessage, str | None]:
        reasoning = None
        if self.reasoning_parser is not None:
            reasoning, text = self.reasoning_parser.split(text, self.starts_in_reasoning)
            text = text or ""
        content, calls = extract_tool_calls(self.plan, text)
        # As vLLM: content is null when the reply was all reasoning or all tool calls.
        answered = content or (not calls and reasoning is None)
        message = ChatResponseMessage(
            content=content if answered else None,
            reasoning_content=reasoning,
            tool_calls=calls,
        )
        return message, _finish_reason(finish_reason, calls, self.plan)

    def stream(self) -> ChoiceStream:
        return ChoiceStream(self)


class ChoiceStream:
    """The deltas of one streamed choice: one ChatDelta per engine step at most, so a chunk
    holds one entry per choice (OpenAI's shape; clients read `chunk.choices[0].delta`)."""

    def __init__(self, shaper: ReplyShaper) -> None:
        self.shaper = shaper
        self._think = ThinkStream(shaper.starts_in_reasoning) if shaper.reasoning_parser else None
        self._content = ""  # all answer text so far
        self._sent = 0  # how much of it went out as content
        self._parser = shaper.plan.call_parser
        # Where the calls begin in _content: forced calls from the first character, "auto"
        # ones once the parser sees its start marker; None while the text is content.
        self._calls_start: int | None = 0 if shaper.plan.is_forced else None
        self._may_call = shaper.plan.is_active  # False once "auto" text proved not to be a call
        self._held_at = 0  # "auto", before a call starts: content from here on is held
        self.call_ids: list[str] = []  # calls begun, in order
        self._arguments_sent: list[str] = []  # each begun call's arguments sent so far

    def feed(self, text_delta: str, final: bool) -> ChatDelta | None:
        """The delta for this step's text (None when there is nothing to send yet); final
        flushes what was held."""
        reasoning_delta, content_delta = "", text_delta
        if self._think is not None:
            reasoning_delta, content_delta = self._think.feed(text_delta, final)
        self._content += content_delta
        if self._may_call and self._calls_start is None:
            self._find_calls_start(final)
        tool_calls = self._call_deltas() if self._calls_start is not None else []
        if final and not self.call_ids:
            self._may_call = False
        if not self._may_call:
            self._calls_start = None  # no call after all: everything held is content
            content_end = len(self._content)
        elif self._calls_start is not None:
            content_end = self._calls_start
        else:
            content_end = self._held_at
        content = self._content[self._sent : content_end] if content_end > self._sent else ""
        self._sent = max(self._sent, content_end)
        if not (reasoning_delta or content or tool_calls):
            return None
        return ChatDelta(
            reasoning_content=reasoning_delta or None,
            content=content or None,
            tool_calls=tool_calls or None,
        )

    def _find_calls_start(self, final: bool) -> None:
        assert self._parser is not None
        start = self._parser.find_start(self._content)
        if start >= 0:
            self._calls_start = start
        elif not final:
            # Hold what may be the start of the marker (and trailing whitespace) as content.
            self._held_at = len(self._content) - _held_suffix(
                self._content, self._parser.start_marker
            )
            return
        self._held_at = len(self._content) if start < 0 else start

    def _call_deltas(self) -> list[DeltaToolCall]:
        """New fragments of the calls: a call begins (id, type, name) once its name is known
        and is a tool's; its arguments then stream as the model writes them. A stream cannot
        take back what it sent, so a call that breaks later stays as sent (a whole reply would
        be plain text), and finish_reason "length" tells of one cut off by max_tokens."""
        assert self._parser is not None and self._calls_start is not None
        calls, is_clean = self._parser.scan(self._content[self._calls_start :])
        deltas = []
        for index, call in enumerate(calls):
            if call.name is None:
                break
            is_new = index == len(self.call_ids)
            if is_new:
                if call.name not in self.shaper.plan.tool_names:
                    if not self.call_ids:
                        self._may_call = False  # text that names no tool is content
                    break
                self.call_ids.append(new_tool_call_id())
                self._arguments_sent.append("")
            sent = self._arguments_sent[index]
            if not call.arguments.startswith(sent):
                break  # the arguments changed under us (a second arguments key): stop here
            fragment = call.arguments[len(sent) :]
            self._arguments_sent[index] = call.arguments
            if is_new:
                deltas.append(DeltaToolCall(
                    index=index, id=self.call_ids[index], type="function",
                    function=DeltaFunctionCall(name=call.name, arguments=fragment),
                ))
            elif fragment:
                deltas.append(
                    DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=fragment))
                )
        if not is_clean and not self.call_ids:
            self._may_call = False  # the text left the format before any call began
        return deltas

    def finish_reason(self, finish_reason: str | None) -> str | None:
        return _finish_reason(finish_reason, self.call_ids, self.shaper.plan)


def _finish_reason(finish_reason: str | None, calls: list, plan: ToolPlan) -> str | None:
    """"tool_calls" for a reply that called tools, except under a named tool_choice: OpenAI and
    vLLM end a forced call of one named function with "stop"."""
    if calls and finish_reason == "stop" and plan.mode != "named":
        return "tool_calls"
    return finish_reason


def _held_suffix(text: str, marker: str) -> int:
    """Trailing characters to hold: whitespace, and what may be the start of the marker."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return length + (len(text) - length - len(text[: len(text) - length].rstrip()))
    return len(text) - len(text.rstrip())
