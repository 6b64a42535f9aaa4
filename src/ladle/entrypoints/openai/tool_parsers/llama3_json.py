"""Llama 3.x JSON calls: {"name": ..., "parameters": {...}}, optionally after <|python_tag|>,
several separated by ';'."""

from __future__ import annotations

import json

from ladle.entrypoints.openai.tool_parsers.base import ToolParser, is_cut_marker, scan_objects
from ladle.entrypoints.openai.tool_parsers.partial_json import CallProgress, skip_whitespace

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    start_marker = "{"

    def find_start(self, text: str) -> int:
        # A call is the whole reply: it starts the text (after whitespace or the python tag).
        stripped = text.lstrip()
        offset = len(text) - len(stripped)
        if stripped and (stripped.startswith(PYTHON_TAG) or PYTHON_TAG.startswith(stripped)):
            return offset  # a tag, or (streaming) perhaps the start of one
        return offset if stripped.startswith("{") else -1

    def scan(self, text: str) -> tuple[list[CallProgress], bool]:
        position = skip_whitespace(text, 0)
        if is_cut_marker(text, position, PYTHON_TAG):
            return [], True
        if text.startswith(PYTHON_TAG, position):
            position += len(PYTHON_TAG)
        calls, _, is_clean = scan_objects(text, position, ("parameters", "arguments"), ";")
        return calls, is_clean

    def render_call(self, name: str, arguments: dict) -> str:
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
