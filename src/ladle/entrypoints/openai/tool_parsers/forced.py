"""The replies of forced tool calls, written under a grammar (tool_calling.py), read the same
way as a family's own format so they stream the same way: `tool_choice: "required"` writes a
JSON array of {"name", "parameters"}; a named function writes its arguments object alone."""

from __future__ import annotations

from ladle.entrypoints.openai.tool_parsers.base import ToolParser, scan_objects
from ladle.entrypoints.openai.tool_parsers.partial_json import (
    CallProgress,
    arguments_text,
    skip_whitespace,
    value_end,
)


class RequiredCallsParser(ToolParser):
    name = "required"

    def find_start(self, text: str) -> int:
        return 0

    def scan(self, text: str) -> tuple[list[CallProgress], bool]:
        position = skip_whitespace(text, 0)
        if position == len(text):
            return [], True
        if text[position] != "[":
            return [], False
        calls, end, is_clean = scan_objects(
            text, position + 1, ("parameters",), separators=",", closer="]"
        )
        if end is not None:
            is_clean = is_clean and not text[end:].strip()
        return calls, is_clean


class NamedArgumentsParser(ToolParser):
    """The whole reply is the named function's arguments."""

    name = "named"

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name

    def find_start(self, text: str) -> int:
        return 0

    def scan(self, text: str) -> tuple[list[CallProgress], bool]:
        position = skip_whitespace(text, 0)
        if position == len(text):
            return [], True
        if text[position] != "{":
            return [], False
        end = value_end(text, position)
        call = CallProgress(
            name=self.function_name,
            arguments=arguments_text(text, position, end),
            is_complete=end is not None,
        )
        return [call], end is None or not text[end:].strip()
