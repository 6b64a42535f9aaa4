"""Parsers of the tool calls a model writes in its family's own format (`tool_choice: auto`).

hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>   Qwen2.5 / Qwen3, SmolLM2
llama3_json  {"name": ..., "parameters": {...}} (optionally after <|python_tag|>)   Llama 3.x
mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}]   Mistral

Chosen by `--tool-call-parser` or from the chat template's own markers (select_tool_parser).
"""

from __future__ import annotations

from ladle.entrypoints.openai.tool_parsers.base import ParsedToolCall, ToolParser
from ladle.entrypoints.openai.tool_parsers.hermes import HermesToolParser
from ladle.entrypoints.openai.tool_parsers.llama3_json import Llama3JsonToolParser
from ladle.entrypoints.openai.tool_parsers.mistral import MistralToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
}


def select_tool_parser(name: str | None, chat_template: str | None) -> ToolParser:
    """The parser named by --tool-call-parser, else the one whose markers the template uses
    (Hermes when it shows none: ladle then describes the tools in Hermes form itself)."""
    if name is not None:
        if name not in TOOL_PARSERS:
            raise ValueError(
                f"unknown tool call parser {name!r}; choose one of {', '.join(TOOL_PARSERS)}"
            )
        return TOOL_PARSERS[name]()
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return MistralToolParser()
    if "<|python_tag|>" in template or "ipython" in template:
        return Llama3JsonToolParser()
    return HermesToolParser()


__all__ = ["TOOL_PARSERS", "ParsedToolCall", "ToolParser", "select_tool_parser"]
