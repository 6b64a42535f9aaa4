"""What a step of n tokens costs, learned from the engine's own decode-only step timings.

Each decode-only step's wall time goes into a moving average for its token count. step_seconds(n)
reads the average at n, interpolates linearly between the nearest measured counts, and beyond the
largest measured count extends the line through the two largest (never falling). With one count
measured the cost is taken as flat (the memory-bound case: speculation looks free until a larger
step has been timed, which drafting itself then provides).
"""

from __future__ import annotations

import bisect

SMOOTHING = 0.2  # weight of the newest step in a count's average


class StepCostModel:
    def __init__(self) -> None:
        self.seconds_by_tokens: dict[int, float] = {}
        self._counts: list[int] = []  # the measured token counts, sorted

    def observe(self, num_tokens: int, seconds: float) -> None:
        if num_tokens <= 0 or seconds <= 0:
            return
        previous = self.seconds_by_tokens.get(num_tokens)
        if previous is None:
            bisect.insort(self._counts, num_tokens)
            self.seconds_by_tokens[num_tokens] = seconds
        else:
            self.seconds_by_tokens[num_tokens] = previous + SMOOTHING * (seconds - previous)

    def step_seconds(self, num_tokens: int) -> float:
        """Seconds of a decode step of num_tokens tokens (1.0 before any step was timed)."""
        counts = self._counts
        table = self.seconds_by_tokens
        if not counts:
            return 1.0
        if num_tokens in table:
            return table[num_tokens]
        if len(counts) == 1:
            return table[counts[0]]
        index = bisect.bisect_left(counts, num_tokens)
        if index == 0:
            low, high = counts[0], counts[1]
        elif index == len(counts):
            low, high = counts[-2], counts[-1]
        else:
            low, high = counts[index - 1], counts[index]
        slope = max((table[high] - table[low]) / (high - low), 0.0)
        if index == 0:
            return max(table[low] - slope * (low - num_tokens), table[low] * 0.5)
        return table[low] + slope * (num_tokens - low)
