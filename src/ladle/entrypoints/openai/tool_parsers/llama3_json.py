"""Llama 3.x JSON calls: {"name": ..., "parameters": {...}}, optionally after <|python_tag|>,
several separated by ';'."""

from __future__ import annotations

import json

from ladle.entrypoints.openai.tool_parsers.base import (
    ParsedToolCall,
    ToolParser,
    call_from_object,
    decode_json_values,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    start_marker = "{"

    def find_start(self, text: str) -> int:
        # A call is the whole reply: it starts the text (after whitespace or the python tag).
        stripped = text.lstrip()
        offset = len(text) - len(stripped)
        if stripped.startswith(PYTHON_TAG):
            return offset
        return offset if stripped.startswith("{") else -1

    def parse_calls(self, text: str) -> list[ParsedToolCall] | None:
        text = text.strip()
        if text.startswith(PYTHON_TAG):
            text = text[len(PYTHON_TAG) :]
        values = decode_json_values(text, separators=";")
        if not values:
            return None
        calls = []
        for value in values:
            key = "parameters" if isinstance(value, dict) and "parameters" in value else "arguments"
            call = call_from_object(value, key)
            if call is None:
                return None
            calls.append(call)
        return calls

    def render_call(self, name: str, arguments: dict) -> str:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
