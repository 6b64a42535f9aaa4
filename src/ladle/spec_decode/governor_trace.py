"""LADLE_SPEC_GOVERNOR_TRACE=PATH: the speculation governor's epochs as JSON lines in PATH, one
per ended epoch (governor.py's trace record), for studying its decisions where the `[ladle]
speculation ...` lines are too coarse (a level whose two modes measure close). Unset: nothing
is written. A process of several engines (a test) appends to the one file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable


def governor_trace_from_env() -> Callable[[dict], None] | None:
    path = os.environ.get("LADLE_SPEC_GOVERNOR_TRACE")
    if not path:
        return None
    stream = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the engine

    def write(record: dict) -> None:
        stream.write(json.dumps(record) + "\n")

    return write
