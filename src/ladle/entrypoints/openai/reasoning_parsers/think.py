"""<think>...</think> reasoning (Qwen3, DeepSeek-R1): whole replies and streamed deltas.

A reply is reasoning up to `</think>` when it opens with `<think>`, or when the prompt already
opened the block (templates that write `<think>` themselves: `starts_in_reasoning`). Otherwise it
is all answer, e.g. Qwen3 with enable_thinking=false, whose template closes an empty block. The
same rule decides whole replies and streams, so both give the same split.
"""

from __future__ import annotations

START = "<think>"
END = "</think>"


class ThinkReasoningParser:
    start_tag = START
    end_tag = END

    @staticmethod
    def starts_in_reasoning(prompt_text: str) -> bool:
        """True when the prompt ends inside an open <think> block."""
        return prompt_text.rfind(START) > prompt_text.rfind(END)

    def split(self, text: str, starts_in_reasoning: bool = False) -> tuple[str | None, str | None]:
        """(reasoning_content, content) of a whole reply."""
        stream = ThinkStream(starts_in_reasoning)
        reasoning, content = stream.feed(text, final=True)
        if not stream.saw_reasoning:
            return None, content or None
        return reasoning, (content or None)


class ThinkStream:
    """Routes streamed text to reasoning or content; holds back what may be half a tag."""

    def __init__(self, starts_in_reasoning: bool = False) -> None:
        self._pending = ""
        # None: the reply's start is not yet known to open a <think> block or not.
        self._in_reasoning: bool | None = True if starts_in_reasoning else None
        self.saw_reasoning = starts_in_reasoning
        self._strip_newlines = False  # the newlines right after </think> belong to neither

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        """(reasoning delta, content delta) for the new text; final flushes what was held."""
        text = self._pending + delta
        self._pending = ""
        if self._in_reasoning is None:
            stripped = text.lstrip()
            if not final and START.startswith(stripped):
                self._pending = text  # may still become <think>
                return "", ""
            self._in_reasoning = stripped.startswith(START)
            if self._in_reasoning:
                self.saw_reasoning = True
                text = stripped[len(START) :]
        if not self._in_reasoning:
            return "", self._content(text)
        index = text.find(END)
        if index < 0:
            keep = 0 if final else _partial_suffix(text, END)
            self._pending = text[len(text) - keep :]
            return text[: len(text) - keep], ""
        self._in_reasoning = False
        self._strip_newlines = True
        return text[:index], self._content(text[index + len(END) :])

    def _content(self, text: str) -> str:
        if self._strip_newlines:
            text = text.lstrip("\n")
            self._strip_newlines = not text
        return text


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0
