"""--chat-template: a Jinja chat template given inline or as a file, replacing the tokenizer's.

As vLLM reads it: a value that names an existing file is read from it; a value holding Jinja
syntax or a line break is the template itself; anything else is a missing file, said so.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_JINJA_MARKERS = ("{{", "{%", "\n")


def load_chat_template(value: str | os.PathLike) -> str:
    """The template text of a --chat-template value (a path may be os.PathLike: always a
    file); ValueError names what is wrong."""
    if isinstance(value, os.PathLike):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ValueError(f"chat template file {os.fspath(value)!r} does not exist")
        value = path.read_text(encoding="utf-8")
        _check_syntax(value)
        return value
    if not value.strip():
        raise ValueError("--chat-template is empty")
    path = Path(value).expanduser()
    if not any(marker in value for marker in _JINJA_MARKERS):
        if not path.is_file():
            raise ValueError(
                f"--chat-template {value!r} is neither a file nor a Jinja template "
                "(an inline template holds {{ ... }} or {% ... %})"
            )
        value = path.read_text(encoding="utf-8")
    _check_syntax(value)
    return value


def apply_chat_template_override(hf_tokenizer: Any, template: str | None) -> None:
    """Make `template` the tokenizer's chat template (None: keep the model's)."""
    if template is not None and hf_tokenizer is not None:
        hf_tokenizer.chat_template = template


def _check_syntax(template: str) -> None:
    from jinja2 import Environment, TemplateSyntaxError

    try:
        Environment().parse(template)
    except TemplateSyntaxError as error:
        raise ValueError(
            f"--chat-template is not a valid Jinja template (line {error.lineno}: {error})"
        ) from error
