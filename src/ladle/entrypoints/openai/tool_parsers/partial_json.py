"""Reading tool calls out of JSON text that may still be growing, one engine step at a time.

A streamed tool call sends its arguments as the model writes them (OpenAI's and vLLM's shape),
so the parsers must say, for text that stops anywhere, which calls have begun, whose names are
known, and how much of each call's arguments has been written. The arguments are the model's
own JSON text, sliced out of the reply rather than re-encoded: every step's slice is then a
prefix of the next one's, so a stream can send just the new characters, and the whole reply
(which slices the same text) gives the same string the stream reassembles to.

The scan only finds where values start and end (strings, brackets, literals); whether a finished
call is valid JSON is checked once it is complete (`is_valid_call`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

WHITESPACE = " \t\r\n"


@dataclass
class CallProgress:
    """One tool call as far as the text goes."""

    name: str | None = None  # set once the name's string is complete
    arguments: str = ""  # the arguments' JSON text so far; each step's is a prefix of the next
    is_complete: bool = False  # the call's text has ended (its object closed)
    is_broken: bool = False  # the text cannot become a call; nothing more will be added


def skip_whitespace(text: str, position: int, also: str = "") -> int:
    skip = WHITESPACE + also
    while position < len(text) and text[position] in skip:
        position += 1
    return position


def string_end(text: str, position: int) -> int | None:
    """The index after the JSON string starting at text[position] == '"'; None if unfinished."""
    index = position + 1
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == '"':
            return index + 1
        index += 1
    return None


def value_end(text: str, position: int) -> int | None:
    """The index after the JSON value starting at text[position]; None if unfinished.
    Brackets are matched outside strings only; the content is not validated here."""
    first = text[position]
    if first == '"':
        return string_end(text, position)
    if first in "{[":
        depth = 0
        index = position
        while index < len(text):
            char = text[index]
            if char == '"':
                end = string_end(text, index)
                if end is None:
                    return None
                index = end
                continue
            if char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 0:
                    return index + 1
            index += 1
        return None
    # A number or a literal: it ends where its characters do; at the end of the text it may
    # still grow (12 -> 123), so it is unfinished.
    index = position
    while index < len(text) and text[index] in "0123456789+-.eEtruefalsn":
        index += 1
    return index if index < len(text) else None


def scan_call_object(
    text: str, position: int, arguments_keys: tuple[str, ...]
) -> tuple[CallProgress, int | None]:
    """A {"name": ..., <arguments key>: {...}} object starting at text[position] == '{':
    (progress, index after its closing brace or None while unfinished). The first of
    arguments_keys present wins ("parameters" before "arguments" for Llama 3)."""
    call = CallProgress()
    arguments_rank = len(arguments_keys)
    index = position + 1
    while True:
        index = skip_whitespace(text, index)
        if index == len(text):
            return call, None
        if text[index] == "}":
            call.is_complete = True
            if arguments_rank == len(arguments_keys):
                call.arguments = "{}"  # a call without arguments takes none
            return call, index + 1
        if text[index] != '"':
            call.is_broken = True
            return call, None
        key_end = string_end(text, index)
        if key_end is None:
            return call, None
        key = _decode_string(text[index:key_end])
        index = skip_whitespace(text, key_end)
        if index == len(text):
            return call, None
        if text[index] != ":":
            call.is_broken = True
            return call, None
        index = skip_whitespace(text, index + 1)
        if index == len(text):
            return call, None
        end = value_end(text, index)
        if key == "name":
            if end is not None and text[index] == '"':
                call.name = _decode_string(text[index:end])
        elif key in arguments_keys and arguments_keys.index(key) < arguments_rank:
            arguments_rank = arguments_keys.index(key)
            call.arguments = arguments_text(text, index, end)
        if end is None:
            return call, None
        index = skip_whitespace(text, end)
        if index == len(text):
            return call, None
        if text[index] == ",":
            index += 1
        elif text[index] != "}":
            call.is_broken = True
            return call, None


def arguments_text(text: str, start: int, end: int | None) -> str:
    """The arguments value text[start:end] as OpenAI's `arguments` string. An object streams as
    it grows; some models write the arguments as a JSON string holding the object's text, which
    is decoded once complete (half an escaped string is not a prefix of its decoded text)."""
    if text[start] == "{":
        return text[start:end] if end is not None else text[start:]
    if end is None:
        return ""
    if text[start] == '"':
        decoded = _decode_string(text[start:end])
        return decoded if decoded is not None else text[start:end]
    return text[start:end]


def is_valid_call(call: CallProgress, tool_names: set[str] | None) -> bool:
    """A finished call to a known tool (any name when tool_names is None) whose arguments are a
    JSON object."""
    if not call.is_complete or call.is_broken or call.name is None:
        return False
    if tool_names is not None and call.name not in tool_names:
        return False
    try:
        return isinstance(json.loads(call.arguments or "{}"), dict)
    except ValueError:
        return False


def _decode_string(literal: str) -> str | None:
    try:
        value = json.loads(literal)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
