"""Where start-up's seconds go: each phase's wall time, printed as one stderr line and read back.

The worker times its phases (model load, the Triton build pass, the memory probe, KV cache
allocation, graph capture) and the engine core adds the warm-up; the engine prints

    [ladle] start-up phases: model load 1.21 s, kernel builds 0.40 s, ...

`ladle bench startup` reads that line from a child's stderr (parse_startup_phases) so a user sees
where the seconds of the end-to-end figure went. No torch here: the bench's API-side process
imports this module.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator

STARTUP_PHASES_PREFIX = "[ladle] start-up phases: "
_PHASE = re.compile(r"\s*(.+?) (\d+(?:\.\d+)?) s\s*$")


class StartupClock:
    """Seconds per named phase, in the order they ran. `settle` (a device synchronize, say) runs
    before each phase's clock stops, so queued device work is counted where it was launched."""

    def __init__(self, settle: Callable[[], None] | None = None) -> None:
        self.phases: list[tuple[str, float]] = []
        self._settle = settle

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            if self._settle is not None:
                self._settle()
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        """Record a phase timed elsewhere; a name seen before adds to its time."""
        for index, (known, before) in enumerate(self.phases):
            if known == name:
                self.phases[index] = (name, before + seconds)
                return
        self.phases.append((name, seconds))


def describe_startup_phases(phases: list[tuple[str, float]] | tuple) -> str:
    """The stderr line (without a newline) for these phases."""
    return STARTUP_PHASES_PREFIX + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases)


def parse_startup_phases(text: str) -> dict[str, float]:
    """{phase: seconds} from the last start-up phases line in `text` (a child's stderr); empty
    when there is none. Phase names hold no commas."""
    phases: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(STARTUP_PHASES_PREFIX):
            continue
        phases = {}
        for item in line[len(STARTUP_PHASES_PREFIX) :].split(","):
            match = _PHASE.match(item)
            if match is not None:
                phases[match.group(1)] = float(match.group(2))
    return phases
