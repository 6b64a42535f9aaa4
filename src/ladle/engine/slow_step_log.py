"""A line on stderr for each engine step slower than LADLE_SLOW_STEP_MS (unset: none).

A running stream waits at least one step between tokens, so a server's inter-token tail is its
slow steps. /metrics' ladle:step_duration_seconds says how many there are; this says which: the
step's shape, whether it replayed a CUDA graph, and how the time split between launching it
(host work: scheduling, inputs, an eager model's launches) and reading the step before it back
(with overlapped scheduling: that step's GPU time not yet hidden).
"""

from __future__ import annotations

import os
import sys

from ladle.protocol.step import StepPlan


def slow_step_threshold_s() -> float | None:
    """LADLE_SLOW_STEP_MS in seconds, or None when unset (or not a positive number)."""
    value = os.environ.get("LADLE_SLOW_STEP_MS")
    try:
        threshold_ms = float(value) if value else 0.0
    except ValueError:
        print(f"[ladle] LADLE_SLOW_STEP_MS={value!r} is not a number: slow steps not logged",
              file=sys.stderr)
        return None
    return threshold_ms / 1000 if threshold_ms > 0 else None


def log_slow_step(
    seconds: float,
    launch_seconds: float,
    graphed: bool,
    step: StepPlan,
    previous: StepPlan | None,
) -> None:
    before = (
        f"; the step before: {_shape(previous)}" if previous is not None else ""
    )
    print(
        f"[ladle] slow step {seconds * 1000:.1f} ms (launch {launch_seconds * 1000:.1f} ms, "
        f"{'graph' if graphed else 'eager'}): {_shape(step)}{before}",
        file=sys.stderr,
        flush=True,
    )


def _shape(step: StepPlan) -> str:
    return (
        f"{len(step.scheduled)} requests, {step.num_prefill_tokens} prompt tokens, "
        f"{step.num_decode_tokens} decodes"
    )
