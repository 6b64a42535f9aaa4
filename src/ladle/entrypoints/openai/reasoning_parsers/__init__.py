"""Reasoning parsers: split a reasoning model's thinking from its answer (`reasoning_content`).

Chosen by `--reasoning-parser` or from the chat template (one that writes `<think>`).
"""

from __future__ import annotations

from ladle.entrypoints.openai.reasoning_parsers.think import ThinkReasoningParser

REASONING_PARSERS = {"qwen3": ThinkReasoningParser, "deepseek_r1": ThinkReasoningParser}


def select_reasoning_parser(
    name: str | None, chat_template: str | None
) -> ThinkReasoningParser | None:
    if name is not None:
        if name not in REASONING_PARSERS:
            raise ValueError(
                f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}"
            )
        return REASONING_PARSERS[name]()
    if chat_template and "</think>" in chat_template:
        return ThinkReasoningParser()
    return None


__all__ = ["REASONING_PARSERS", "ThinkReasoningParser", "select_reasoning_parser"]
