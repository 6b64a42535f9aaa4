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


class _WholeReplyParser(ToolParser):
    """A reply that is the forced call from its first character on (after whitespace), which
    must be `opener`."""

    opener: str

    def find_start(self, text: str) -> int:
        return 0

    def scan(self, text: str) -> tuple[list[CallProgress], bool]:
        position = skip_whitespace(text, 0)
        if position == len(text):
            return [], True
        if text[position] != self.opener:
            return [], False
        return self.scan_from(text, position)

    def scan_from(self, text: str, position: int) -> tuple[list[CallProgress], bool]:
        """The calls from the opener at `position`, and whether nothing stray follows."""
        raise NotImplementedError


class RequiredCallsParser(_WholeReplyParser):
    name = "required"
    opener = "["

    def scan_from(self, text: str, position: int) -> tuple[list[CallProgress], bool]:
        calls, end, is_clean = scan_objects(
            text, position + 1, ("parameters",), separators=",", closer="]"
        )
        if end is not None:
            is_clean = is_clean and not text[end:].strip()
        return calls, is_clean


class NamedArgumentsParser(_WholeReplyParser):
    """The whole reply is the named function's arguments."""

    name = "named"
    opener = "{"

    def __init__(self, function_name: str) -> None:
        self.function_name = function_name

    def scan_from(self, text: str, position: int) -> tuple[list[CallProgress], bool]:
        end = value_end(text, position)
        call = CallProgress(
            name=self.function_name,
            arguments=arguments_text(text, position, end),
            is_complete=end is not None,
        )
        return [call], end is None or not text[end:].strip()
