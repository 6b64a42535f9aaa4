"""Whole numbers with vLLM's size suffixes ("32k" == 32000, "32K" == 32768), for the CLI's
integer flags and the same options given to LLM(...) as strings."""

from __future__ import annotations

import re

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30}


def parse_size_text(text: str) -> int:
    """An integer that may carry a size suffix: k/m/g are powers of 1000, K/M/G of 1024.
    Raises ValueError for anything else."""
    match = _SIZE.match(str(text))
    if match is None:
        raise ValueError(f"{text!r} is not a whole number (sizes like 32k work)")
    number, suffix = match.groups()
    scale = _DECIMAL.get(suffix) or _BINARY.get(suffix) or 1
    value = float(number) * scale
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number")
    return int(value)
