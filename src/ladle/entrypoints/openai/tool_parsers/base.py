"""The tool parser interface: model text in, (content, tool calls) out, never a broken call."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # JSON text of an object


class ToolParser:
    """Subclasses set start_marker (where a call may begin; text before it streams as content)
    and implement parse_calls."""

    name = ""
    start_marker = ""

    def extract(self, text: str, tool_names: set[str]) -> tuple[str | None, list[ParsedToolCall]]:
        """(content, calls). If any call is malformed or names an unknown tool, the whole text
        is returned as content with no calls: a reply is either parsed calls or plain text."""
        index = self.find_start(text)
        if index < 0:
            return text, []
        calls = self.parse_calls(text[index:])
        if not calls or any(call.name not in tool_names for call in calls):
            return text, []
        content = text[:index].strip()
        return (content or None), calls

    def find_start(self, text: str) -> int:
        return text.find(self.start_marker)

    def parse_calls(self, text: str) -> list[ParsedToolCall] | None:
        raise NotImplementedError

    def render_call(self, name: str, arguments: dict) -> str:
        """How this family writes one call (for history turns of templates that know no tools)."""
        raise NotImplementedError


def call_from_object(value: object, arguments_key: str) -> ParsedToolCall | None:
    """{"name": str, arguments_key: object} -> a call, else None."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, {})
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedToolCall(name=value["name"], arguments=json.dumps(arguments, ensure_ascii=False))


def decode_json_values(text: str, separators: str = "") -> list[object] | None:
    """Consecutive JSON values in text (whitespace or the given separators between them);
    None when anything else is there."""
    decoder = json.JSONDecoder()
    values = []
    position = 0
    skip = " \t\r\n" + separators
    while True:
        while position < len(text) and text[position] in skip:
            position += 1
        if position == len(text):
            return values
        try:
            value, position = decoder.raw_decode(text, position)
        except ValueError:
            return None
        values.append(value)
