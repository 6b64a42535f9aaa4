"""Offline chat messages as vLLM's LLM.chat takes them: a message's content may be a string or
OpenAI's list of content parts. ladle serves text-only models, so text parts are joined into one
string for the chat template and any other part is a ValueError naming where it is."""

from __future__ import annotations

from typing import Any

# vLLM's chat_template_content_format values; for text-only content all render the same text.
CONTENT_FORMATS = ("auto", "string", "openai")


def text_only_conversation(conversation: list[Any]) -> list[Any]:
    """The conversation with every content-part list joined into its text (other messages and
    fields unchanged; malformed messages are left for the template's validation to name)."""
    return [
        _text_only_message(message, index) if isinstance(message, dict) else message
        for index, message in enumerate(conversation)
    ]


def check_chat_options(
    add_generation_prompt: bool, continue_final_message: bool, content_format: str
) -> None:
    """ValueError naming the option that cannot be honoured."""
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt cannot both be true (pass "
            "add_generation_prompt=False to continue the last assistant message)"
        )
    if content_format not in CONTENT_FORMATS:
        raise ValueError(
            f"chat_template_content_format must be one of {', '.join(CONTENT_FORMATS)}, "
            f"got {content_format!r}"
        )


def _text_only_message(message: dict, index: int) -> dict:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    texts = []
    for part_index, part in enumerate(content):
        part_type = part.get("type") if isinstance(part, dict) else None
        if part_type != "text" or not isinstance(part.get("text"), str):
            raise ValueError(
                f"messages[{index}].content[{part_index}] has type {part_type!r}: only text "
                "parts ({'type': 'text', 'text': ...}) are supported (text-only models)"
            )
        texts.append(part["text"])
    return {**message, "content": "".join(texts)}
