"""StructuredOutputsParams: the constraint a request puts on its output, in vLLM's spelling.

Exactly one of json / regex / choice / grammar / json_object. Each becomes one llguidance grammar
string (`to_grammar`), which is also the cache key of its compiled form. Validation parses the
grammar without a tokenizer (milliseconds, cached), so a bad schema, regex or grammar is a
ValueError naming the problem before the request reaches the engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

# Compact separators: flexible whitespace lets a small model loop on spaces and newlines until
# max_tokens, and ", " / ": " is how models (and json.dumps) write JSON anyway.
JSON_COMPILE_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_GRAMMAR_CHARACTERS = 1_000_000


@dataclass
class StructuredOutputsParams:
    """One constraint on a request's output (vLLM's `structured_outputs`).

    json: a JSON schema (dict or its JSON text); the output is a JSON value matching it.
    regex: the output matches this regular expression (Rust regex syntax).
    choice: the output is exactly one of these strings.
    grammar: a context-free grammar, Lark or GBNF/EBNF (llama.cpp) syntax.
    json_object: the output is any JSON object (OpenAI's response_format json_object).
    reasoning_end_token_ids: set by the server for reasoning models: the constraint starts only
        after the output contains these tokens (the end of `<think>...</think>`).
    """

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    reasoning_end_token_ids: list[int] | None = None

    def __post_init__(self) -> None:
        given = [
            name
            for name in ("json", "regex", "choice", "grammar")
            if getattr(self, name) is not None
        ] + (["json_object"] if self.json_object else [])
        if len(given) != 1:
            raise ValueError(
                "structured_outputs must set exactly one of json, regex, choice, grammar, "
                f"json_object; got {', '.join(given) if given else 'none'}"
            )
        self.to_grammar()  # validates (cached by source)

    @property
    def kind(self) -> str:
        if self.json_object:
            return "json_object"
        for name in ("json", "regex", "choice", "grammar"):
            if getattr(self, name) is not None:
                return name
        raise AssertionError("validated in __post_init__")

    def _source(self) -> str:
        """A hashable text form of the constraint (the grammar cache's key)."""
        if self.json_object:
            return ""
        if self.json is not None:
            return self.json if isinstance(self.json, str) else _dump_json(self.json, "json")
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) for c in self.choice):
                raise ValueError("structured_outputs.choice must be a non-empty list of strings")
            return json.dumps(self.choice)
        text = self.regex if self.regex is not None else self.grammar
        if not isinstance(text, str):
            raise ValueError(f"structured_outputs.{self.kind} must be a string")
        return text

    def to_grammar(self) -> str:
        """The llguidance grammar (a JSON string) this constraint compiles from."""
        return _grammar_of(self.kind, self._source())


def _dump_json(value: object, name: str) -> str:
    try:
        return json.dumps(value)  # key order kept: properties come out in the order given
    except (TypeError, ValueError) as error:
        raise ValueError(f"structured_outputs.{name} is not JSON-serialisable: {error}") from None


@lru_cache(maxsize=1024)
def _grammar_of(kind: str, source: str) -> str:
    """Build and validate (parse, no tokenizer) the grammar; ValueError names what is wrong."""
    import llguidance

    if len(source) > MAX_GRAMMAR_CHARACTERS:
        raise ValueError(
            f"structured_outputs.{kind} has {len(source)} characters; at most "
            f"{MAX_GRAMMAR_CHARACTERS} are allowed"
        )
    matcher = llguidance.LLMatcher
    if kind in ("json", "json_object"):
        if kind == "json_object":
            schema: object = {"type": "object"}
        else:
            try:
                schema = json.loads(source)
            except ValueError as error:
                raise ValueError(f"structured_outputs.json is not valid JSON: {error}") from None
        if not isinstance(schema, (dict, bool)):
            raise ValueError(
                f"a JSON schema must be an object (or true/false), got {type(schema).__name__}"
            )
        try:
            grammar = matcher.grammar_from_json_schema(schema, overrides=JSON_COMPILE_OPTIONS)
        except ValueError as error:
            raise ValueError(f"invalid JSON schema: {error}") from None
    elif kind == "regex":
        grammar = matcher.grammar_from_regex(source)
    elif kind == "choice":
        choices = json.loads(source)
        grammar = matcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(choice) for choice in choices)
        )
    else:
        try:
            grammar = llguidance.grammar_from("grammar", source)
        except ValueError as error:
            raise ValueError(f"structured_outputs.grammar does not parse: {error}") from None
    is_error, messages = matcher.validate_grammar_with_warnings(grammar)
    if is_error:
        what = {
            "json": "JSON schema",
            "json_object": "JSON schema",
            "regex": "regex",
            "choice": "choice list",
            "grammar": "grammar",
        }[kind]
        raise ValueError(f"invalid {what} in structured_outputs.{kind}: {messages[0]}")
    return grammar
