"""Decode-first under an ITL SLO: the prompt tokens a step may take so its decodes stay on time.

A step's time grows with the tokens it computes. With decodes running, every step is an
inter-token gap for each of them, so a large prefill chunk beside them breaks the ITL SLO. This
policy fits step time = intercept + slope * tokens to the recent steps (least squares over a
window) and allows the prompt tokens that keep the predicted step within the SLO, less a safety
margin. With no decode running there is no gap to protect and the whole budget is allowed; a
small floor keeps prompts moving however tight the SLO (it cannot starve them).
"""

from __future__ import annotations

import math
from collections import deque

WINDOW = 64
SAFETY = 0.9  # aim below the SLO: the fit is a prediction, not a promise
MIN_SAMPLES = 4


class ItlPrefillBudget:
    """Per-step prompt-token allowance under an inter-token latency SLO."""

    def __init__(self, itl_slo_s: float, max_num_batched_tokens: int, min_prefill_tokens: int = 16):
        if itl_slo_s <= 0:
            raise ValueError(f"itl_slo must be > 0 seconds, got {itl_slo_s}")
        self.itl_slo_s = itl_slo_s
        self.max_num_batched_tokens = max_num_batched_tokens
        self.min_prefill_tokens = min(min_prefill_tokens, max_num_batched_tokens)
        self._samples: deque[tuple[int, float]] = deque(maxlen=WINDOW)

    def observe(self, num_tokens: int, seconds: float) -> None:
        """One finished step: the tokens it computed and its wall time."""
        if num_tokens > 0 and seconds > 0:
            self._samples.append((num_tokens, seconds))

    def fit(self) -> tuple[float, float] | None:
        """(intercept, slope) of step time against tokens; None until the steps vary enough."""
        if len(self._samples) < MIN_SAMPLES:
            return None
        count = len(self._samples)
        mean_x = sum(x for x, _ in self._samples) / count
        mean_y = sum(y for _, y in self._samples) / count
        variance = sum((x - mean_x) ** 2 for x, _ in self._samples)
        if variance == 0:
            return None
        slope = sum((x - mean_x) * (y - mean_y) for x, y in self._samples) / variance
        if slope <= 0:
            return None
        return mean_y - slope * mean_x, slope

    def budget(self, num_decodes: int) -> int:
        """Prompt tokens the next step may schedule beside num_decodes decoding requests."""
        if num_decodes == 0:
            return self.max_num_batched_tokens
        fitted = self.fit()
        if fitted is None:
            return self.max_num_batched_tokens
        intercept, slope = fitted
        # The epsilon keeps float noise from costing a token (0.035 / 0.0002 is 174.99...).
        allowed = math.floor((self.itl_slo_s * SAFETY - intercept) / slope + 1e-6) - num_decodes
        return max(self.min_prefill_tokens, min(allowed, self.max_num_batched_tokens))
