"""The tool parser interface: model text in, (content, tool calls) out, never a broken call.

Each parser scans text that may be cut anywhere (`scan`, partial_json.py): the stream sends what
it finds as it grows, and a whole reply keeps the calls only when every one is complete, valid
and names a known tool (`extract`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ladle.entrypoints.openai.tool_parsers.partial_json import (
    CallProgress,
    is_valid_call,
    scan_call_object,
    skip_whitespace,
)


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # JSON text of an object, as the model wrote it


class ToolParser:
    """Subclasses set start_marker (where a call may begin; text before it streams as content)
    and implement scan."""

    name = ""
    start_marker = ""

    def extract(self, text: str, tool_names: set[str]) -> tuple[str | None, list[ParsedToolCall]]:
        """(content, calls). If any call is malformed or names an unknown tool, the whole text
        is returned as content with no calls: a reply is either parsed calls or plain text."""
        index = self.find_start(text)
        if index < 0:
            return text, []
        calls = self.parse_calls(text[index:], tool_names)
        if not calls:
            return text, []
        content = text[:index].strip()
        return (content or None), calls

    def parse_calls(
        self, text: str, tool_names: set[str] | None = None
    ) -> list[ParsedToolCall] | None:
        """The calls of finished text from find_start on; None unless it is nothing but valid
        calls (to tools in tool_names, when given) and their separators."""
        calls, is_clean = self.scan(text)
        if not is_clean or not calls or not all(is_valid_call(c, tool_names) for c in calls):
            return None
        return [ParsedToolCall(name=c.name, arguments=c.arguments) for c in calls]

    def find_start(self, text: str) -> int:
        return text.find(self.start_marker)

    def scan(self, text: str) -> tuple[list[CallProgress], bool]:
        """(calls so far, is_clean) of text from find_start on, which may stop anywhere.
        is_clean: nothing so far but calls, their markers and separators (a marker cut off at
        the end counts); a stream stops adding to the calls once it is False."""
        raise NotImplementedError

    def render_call(self, name: str, arguments: dict) -> str:
        """How this family writes one call (for history turns of templates that know no tools)."""
        raise NotImplementedError


def scan_objects(
    text: str,
    position: int,
    arguments_keys: tuple[str, ...],
    separators: str = "",
    closer: str = "",
) -> tuple[list[CallProgress], int | None, bool]:
    """Call objects from text[position] on, separated by whitespace or separators, up to closer
    (when given) or the end: (calls, index after the closer or None, is_clean)."""
    calls: list[CallProgress] = []
    while True:
        position = skip_whitespace(text, position, separators)
        if position == len(text):
            return calls, None, True
        if closer and text[position] == closer:
            return calls, position + 1, True
        if text[position] != "{":
            return calls, None, False
        call, end = scan_call_object(text, position, arguments_keys)
        calls.append(call)
        if end is None:
            return calls, None, not call.is_broken
        position = end


def is_cut_marker(text: str, position: int, marker: str) -> bool:
    """text[position:] is the start of marker (the text stops inside it)."""
    rest = text[position:]
    return len(rest) < len(marker) and marker.startswith(rest)
