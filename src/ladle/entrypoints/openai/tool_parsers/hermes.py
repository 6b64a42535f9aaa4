"""Hermes-style calls: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one or more."""

from __future__ import annotations

import json
import re

from ladle.entrypoints.openai.tool_parsers.base import (
    ParsedToolCall,
    ToolParser,
    call_from_object,
    decode_json_values,
)

_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class HermesToolParser(ToolParser):
    name = "hermes"
    start_marker = "<tool_call>"

    def parse_calls(self, text: str) -> list[ParsedToolCall] | None:
        # Only whitespace may sit between calls; a call cut off by max_tokens fails to parse.
        if _CALL.sub("", text).strip():
            return None
        calls = []
        for body in _CALL.findall(text):
            values = decode_json_values(body)
            if not values or len(values) != 1:
                return None
            call = call_from_object(values[0], "arguments")
            if call is None:
                return None
            calls.append(call)
        return calls

    def render_call(self, name: str, arguments: dict) -> str:
        body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return f"<tool_call>\n{body}\n</tool_call>"
