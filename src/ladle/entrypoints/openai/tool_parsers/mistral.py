"""Mistral calls: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], or the newer
[TOOL_CALLS]name[ARGS]{...} form."""

from __future__ import annotations

import json

from ladle.entrypoints.openai.tool_parsers.base import (
    ParsedToolCall,
    ToolParser,
    call_from_object,
    decode_json_values,
)

MARKER = "[TOOL_CALLS]"
ARGS_MARKER = "[ARGS]"


class MistralToolParser(ToolParser):
    name = "mistral"
    start_marker = MARKER

    def parse_calls(self, text: str) -> list[ParsedToolCall] | None:
        pieces = [piece.strip() for piece in text.split(MARKER) if piece.strip()]
        calls: list[ParsedToolCall] = []
        for piece in pieces:
            if ARGS_MARKER in piece and not piece.startswith(("[", "{")):
                name, _, arguments = piece.partition(ARGS_MARKER)
                values = decode_json_values(arguments)
                if not values or len(values) != 1:
                    return None
                call = call_from_object({"name": name.strip(), "arguments": values[0]}, "arguments")
                if call is None:
                    return None
                calls.append(call)
                continue
            values = decode_json_values(piece)
            if not values:
                return None
            for value in values:
                for item in value if isinstance(value, list) else [value]:
                    call = call_from_object(item, "arguments")
                    if call is None:
                        return None
                    calls.append(call)
        return calls

    def render_call(self, name: str, arguments: dict) -> str:
        return MARKER + json.dumps([{"name": name, "arguments": arguments}], ensure_ascii=False)
