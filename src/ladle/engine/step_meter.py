"""StepMeter: how fast the engine computes prompt tokens and how long a step takes, measured.

The SLO admission (API process) predicts a new request's time to first token from the prompt
tokens queued ahead of it and this prefill rate; the live stats line shows the token totals.
The rate is that of the steps that computed prompt tokens, decodes sharing those steps included:
what a queued prompt really gets, not the kernel's peak.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from ladle.core.request import Request
from ladle.protocol.messages import STEP_TIME_BOUNDS_S

# Weight of the newest step in the moving averages: about the last 20 steps count.
SMOOTHING = 0.1


def split_scheduled_tokens(
    requests: list[Request], num_scheduled_tokens: dict[str, int]
) -> tuple[int, int]:
    """(prompt tokens, decode tokens) of a step, read before the step advances the requests.
    A decode is one token for a request that has sampled before and has all but it computed;
    everything else (prompt chunks, a preempted request's recompute) is prefill."""
    num_prefill = num_decode = 0
    for request in requests:
        count = num_scheduled_tokens[request.request_id]
        is_decode = (
            count == 1
            and request.num_output_tokens > 0
            and request.num_computed_tokens == request.num_tokens - 1
        )
        if is_decode:
            num_decode += 1
        else:
            num_prefill += count
    return num_prefill, num_decode


@dataclass
class StepMeter:
    """Moving averages of the prefill rate and the step time, and cumulative token counts."""

    prefill_tokens_per_s: float = 0.0  # 0 until a step has computed prompt tokens
    mean_step_time_s: float = 0.0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    # Steps per STEP_TIME_BOUNDS_S bucket (the last: slower than every bound), apart for steps
    # with prompt tokens and decode-only steps, and each kind's total seconds.
    prefill_step_counts: list[int] = field(
        default_factory=lambda: [0] * (len(STEP_TIME_BOUNDS_S) + 1)
    )
    decode_step_counts: list[int] = field(
        default_factory=lambda: [0] * (len(STEP_TIME_BOUNDS_S) + 1)
    )
    prefill_step_seconds: float = 0.0
    decode_step_seconds: float = 0.0

    def record(self, num_prefill: int, num_decode: int, seconds: float) -> None:
        self.num_prefill_tokens += num_prefill
        self.num_decode_tokens += num_decode
        if seconds <= 0:
            return
        bucket = bisect.bisect_left(STEP_TIME_BOUNDS_S, seconds)
        if num_prefill > 0:
            self.prefill_step_counts[bucket] += 1
            self.prefill_step_seconds += seconds
        elif num_decode > 0:
            self.decode_step_counts[bucket] += 1
            self.decode_step_seconds += seconds
        self.mean_step_time_s = _smooth(self.mean_step_time_s, seconds)
        if num_prefill > 0:
            self.prefill_tokens_per_s = _smooth(self.prefill_tokens_per_s, num_prefill / seconds)


def _smooth(average: float, value: float) -> float:
    return value if average == 0.0 else (1 - SMOOTHING) * average + SMOOTHING * value
