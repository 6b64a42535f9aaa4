"""Mistral calls: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], or the newer
[TOOL_CALLS]name[ARGS]{...} form."""

from __future__ import annotations

import json

from ladle.entrypoints.openai.tool_parsers.base import ToolParser, is_cut_marker, scan_objects
from ladle.entrypoints.openai.tool_parsers.partial_json import (
    CallProgress,
    arguments_text,
    scan_call_object,
    skip_whitespace,
    value_end,
)

MARKER = "[TOOL_CALLS]"
ARGS_MARKER = "[ARGS]"


class MistralToolParser(ToolParser):
    name = "mistral"
    start_marker = MARKER

    def scan(self, text: str) -> tuple[list[CallProgress], bool]:
        calls: list[CallProgress] = []
        position = 0
        while True:
            position = skip_whitespace(text, position)
            if position == len(text) or is_cut_marker(text, position, MARKER):
                return calls, True
            if text.startswith(MARKER, position):
                position += len(MARKER)
                continue
            if text[position] == "{":
                call, end = scan_call_object(text, position, ("arguments",))
                calls.append(call)
                if end is None:
                    return calls, not call.is_broken
                position = end
                continue
            if text[position] == "[":
                found, end, is_clean = scan_objects(
                    text, position + 1, ("arguments",), separators=",", closer="]"
                )
                calls += found
                if end is None:
                    return calls, is_clean
                position = end
                continue
            # name[ARGS]{...}: the call begins once [ARGS] is there.
            args_at = text.find(ARGS_MARKER, position)
            if args_at < 0:
                # Perhaps a name still being written: a call without a name, which a stream
                # skips and a whole reply rejects.
                rest = text[position:]
                calls.append(CallProgress())
                return calls, not any(char in rest for char in "{}]\n")
            call = CallProgress(name=text[position:args_at].strip())
            calls.append(call)
            start = skip_whitespace(text, args_at + len(ARGS_MARKER))
            if start == len(text):
                return calls, True
            end = value_end(text, start)
            call.arguments = arguments_text(text, start, end)
            if end is None:
                return calls, True
            call.is_complete = True
            position = end

    def render_call(self, name: str, arguments: dict) -> str:
        return MARKER + json.dumps([{"name": name, "arguments": arguments}], ensure_ascii=False)

