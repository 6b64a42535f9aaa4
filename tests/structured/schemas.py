"""Twenty varied JSON schemas for the server test: nested objects, arrays, enums, bounded numbers,
optional fields, nullable values, anyOf. Strings and arrays carry bounds, so a 135M model cannot
loop inside one value until max_tokens."""

from __future__ import annotations

NAME = {"type": "string", "minLength": 1, "maxLength": 16}
SCHEMAS: list[tuple[str, dict]] = [
    (
        "a person",
        {
            "type": "object",
            "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
            "required": ["name", "age"],
            "additionalProperties": False,
        },
    ),
    (
        "a yes or no verdict",
        {
            "type": "object",
            "properties": {"verdict": {"enum": ["yes", "no"]}},
            "required": ["verdict"],
            "additionalProperties": False,
        },
    ),
    (
        "a boolean flag",
        {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
            "additionalProperties": False,
        },
    ),
    (
        "a rating",
        {
            "type": "object",
            "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5}},
            "required": ["stars"],
            "additionalProperties": False,
        },
    ),
    (
        "three colours",
        {
            "type": "array",
            "items": {"enum": ["red", "green", "blue"]},
            "minItems": 1,
            "maxItems": 3,
        },
    ),
    (
        "a city with its country",
        {
            "type": "object",
            "properties": {
                "city": NAME,
                "country": {
                    "type": "object",
                    "properties": {
                        "name": NAME,
                        "code": {"type": "string", "pattern": "^[A-Z]{2}$"},
                    },
                    "required": ["name", "code"],
                    "additionalProperties": False,
                },
            },
            "required": ["city", "country"],
            "additionalProperties": False,
        },
    ),
    (
        "a point",
        {
            "type": "object",
            "properties": {
                "x": {"type": "integer", "minimum": -100, "maximum": 100},
                "y": {"type": "integer", "minimum": -100, "maximum": 100},
            },
            "required": ["x", "y"],
            "additionalProperties": False,
        },
    ),
    (
        "a short list of numbers",
        {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 4},
    ),
    (
        "a book",
        {
            "type": "object",
            "properties": {
                "title": NAME,
                "author": NAME,
                "year": {"type": "integer", "minimum": 1400, "maximum": 2030},
                "genre": {"enum": ["fiction", "science", "history"]},
            },
            "required": ["title", "author", "year", "genre"],
            "additionalProperties": False,
        },
    ),
    (
        "an optional nickname",
        {
            "type": "object",
            "properties": {"name": NAME, "nickname": NAME},
            "required": ["name"],
            "additionalProperties": False,
        },
    ),
    (
        "a nullable manager",
        {
            "type": "object",
            "properties": {"employee": NAME, "manager": {"anyOf": [NAME, {"type": "null"}]}},
            "required": ["employee", "manager"],
            "additionalProperties": False,
        },
    ),
    (
        "a temperature",
        {
            "type": "object",
            "properties": {
                "celsius": {"type": "integer", "minimum": -50, "maximum": 60},
                "unit": {"const": "C"},
            },
            "required": ["celsius", "unit"],
            "additionalProperties": False,
        },
    ),
    (
        "a shopping list",
        {
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "maxItems": 3,
                    "items": {
                        "type": "object",
                        "properties": {
                            "item": NAME,
                            "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                        },
                        "required": ["item", "qty"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["items"],
            "additionalProperties": False,
        },
    ),
    (
        "an HTTP status",
        {
            "type": "object",
            "properties": {"code": {"enum": [200, 404, 500]}, "message": NAME},
            "required": ["code", "message"],
            "additionalProperties": False,
        },
    ),
    ("a string", {"type": "string", "maxLength": 24}),
    ("an integer", {"type": "integer", "minimum": 0, "maximum": 1000}),
    (
        "a date",
        {
            "type": "object",
            "properties": {"date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
            "required": ["date"],
            "additionalProperties": False,
        },
    ),
    (
        "a pet",
        {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"cat": NAME},
                    "required": ["cat"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {"dog": NAME},
                    "required": ["dog"],
                    "additionalProperties": False,
                },
            ]
        },
    ),
    (
        "tags",
        {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": NAME, "minItems": 1, "maxItems": 3}},
            "required": ["tags"],
            "additionalProperties": False,
        },
    ),
    (
        "a matrix",
        {
            "type": "array",
            "maxItems": 2,
            "items": {
                "type": "array",
                "maxItems": 2,
                "items": {"type": "integer", "minimum": 0, "maximum": 9},
            },
        },
    ),
]
