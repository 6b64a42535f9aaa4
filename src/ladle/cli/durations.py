"""Durations as users write them on the command line: '500ms', '0.5s', or seconds."""

from __future__ import annotations

import re


def parse_duration(text: str) -> float:
    """'500ms', '0.5s', '2' (seconds) -> seconds; a ValueError names what was wrong."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*", str(text))
    if match is None:
        raise ValueError(f"cannot read {text!r} as a duration; write e.g. 500ms or 0.5s")
    value = float(match.group(1))
    return value / 1000.0 if match.group(2) == "ms" else value
