"""Shaping a chat reply's text into reasoning_content, content and tool_calls, whole or streamed.

The stream of one choice goes text -> reasoning split -> tool-call detection: content streams as
it comes until the text may be starting a tool call; from there it is held, and at the end either
sent as tool-call deltas (OpenAI's shape: id, type and name first, then the arguments) or, if it
was no call after all, as content. Reassembled, a stream gives what the whole reply gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from ladle.entrypoints.openai.protocol import (
    ChatDelta,
    ChatResponseMessage,
    DeltaFunctionCall,
    DeltaToolCall,
    ToolCall,
)
from ladle.entrypoints.openai.reasoning_parsers import ThinkReasoningParser
from ladle.entrypoints.openai.reasoning_parsers.think import ThinkStream
from ladle.entrypoints.openai.tool_calling import ToolPlan, extract_tool_calls


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
        return message, _finish_reason(finish_reason, calls)

    def stream(self) -> ChoiceStream:
        return ChoiceStream(self)


class ChoiceStream:
    """The deltas of one streamed choice."""

    def __init__(self, shaper: ReplyShaper) -> None:
        self.shaper = shaper
        self._think = ThinkStream(shaper.starts_in_reasoning) if shaper.reasoning_parser else None
        self._content = ""  # all answer text so far
        self._sent = 0  # how much of it went out as content
        self._holding = shaper.plan.is_forced  # forced calls are never content
        self.calls: list[ToolCall] = []

    def feed(self, text_delta: str, final: bool) -> list[ChatDelta]:
        deltas = []
        content_delta = text_delta
        if self._think is not None:
            reasoning_delta, content_delta = self._think.feed(text_delta, final)
            if reasoning_delta:
                deltas.append(ChatDelta(reasoning_content=reasoning_delta))
        self._content += content_delta
        plan = self.shaper.plan
        if plan.mode == "auto" and not self._holding:
            assert plan.parser is not None
            start = plan.parser.find_start(self._content)
            if start >= 0:
                self._holding = True
                safe = start
            else:
                safe = len(self._content) - _held_suffix(self._content, plan.parser.start_marker)
            if final:
                safe = len(self._content) if start < 0 else start
            if safe > self._sent:
                deltas.append(ChatDelta(content=self._content[self._sent : safe]))
                self._sent = safe
        elif not self._holding and len(self._content) > self._sent:
            deltas.append(ChatDelta(content=self._content[self._sent :]))
            self._sent = len(self._content)
        if final and self._holding:
            deltas += self._finish_held()
        return deltas

    def _finish_held(self) -> list[ChatDelta]:
        content, calls = extract_tool_calls(self.shaper.plan, self._content)
        if not calls:
            rest = self._content[self._sent :]
            self._sent = len(self._content)
            return [ChatDelta(content=rest)] if rest else []
        self.calls = calls
        deltas = []
        for index, call in enumerate(calls):
            deltas.append(
                ChatDelta(
                    tool_calls=[
                        DeltaToolCall(
                            index=index,
                            id=call.id,
                            type="function",
                            function=DeltaFunctionCall(name=call.function.name, arguments=""),
                        )
                    ]
                )
            )
            deltas.append(
                ChatDelta(
                    tool_calls=[
                        DeltaToolCall(
                            index=index,
                            function=DeltaFunctionCall(arguments=call.function.arguments),
                        )
                    ]
                )
            )
        return deltas

    def finish_reason(self, finish_reason: str | None) -> str | None:
        return _finish_reason(finish_reason, self.calls)


def _finish_reason(finish_reason: str | None, calls: list[ToolCall]) -> str | None:
    return "tool_calls" if calls and finish_reason == "stop" else finish_reason


def _held_suffix(text: str, marker: str) -> int:
    """Trailing characters to hold: whitespace, and what may be the start of the marker."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-length:]):
            return length + (len(text) - length - len(text[: len(text) - length].rstrip()))
    return len(text) - len(text.rstrip())
