"""Hermes-style calls: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one or more."""

from __future__ import annotations

import json

from ladle.entrypoints.openai.tool_parsers.base import ToolParser, is_cut_marker
from ladle.entrypoints.openai.tool_parsers.partial_json import (
    CallProgress,
    scan_call_object,
    skip_whitespace,
)

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class HermesToolParser(ToolParser):
    name = "hermes"
    start_marker = OPEN

    def scan(self, text: str) -> tuple[list[CallProgress], bool]:
        # Only whitespace may sit between calls. A last call may lack its closing tag (the
        # model stopped right after the object).
        calls: list[CallProgress] = []
        position = 0
        while True:
            position = skip_whitespace(text, position)
            if position == len(text) or is_cut_marker(text, position, OPEN):
                return calls, True
            if not text.startswith(OPEN, position):
                return calls, False
            position = skip_whitespace(text, position + len(OPEN))
            if position == len(text):
                return calls, True
            if text[position] != "{":
                return calls, False
            call, end = scan_call_object(text, position, ("arguments",))
            calls.append(call)
            if end is None:
                return calls, not call.is_broken
            position = skip_whitespace(text, end)
            if text.startswith(CLOSE, position):
                position += len(CLOSE)
            elif position == len(text) or is_cut_marker(text, position, CLOSE):
                return calls, True
            else:
                return calls, False

    def render_call(self, name: str, arguments: dict) -> str:
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"{OPEN}\n{body}\n{CLOSE}"
