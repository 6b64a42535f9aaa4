"""TTFT-SLO admission: refuse at once the requests that could not get their first token in time.

Without it, overload lets every request into the queue and every one of them misses the SLO.
With `ladle serve --ttft-slo`, each new request's time to first token is predicted from the
prompt tokens already queued ahead of it (sent to the engine, first token not yet back) plus its
own, divided by the engine's measured prefill rate (engine/step_meter.py, sent with every step's
stats). A request predicted past the SLO (with a margin for the estimate's error) gets 429 with a
Retry-After of the time the queue needs to drain enough for it; the requests let in meet the SLO.

Two cases are always let in: nothing queued ahead (refusing would not make it faster: a prompt
too long for the SLO on its own still gets served), and no measured rate yet (no prediction).

It wraps the queue-bound AdmissionController with the same check / admit / release calls, so the
engine client and the routes need no change; it keeps its own count of the queued tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ladle.engine.admission import AdmissionController, QueueFullError
from ladle.engine.messages import SchedulerStats

# Admit only when the prediction is within this fraction of the SLO: the rate is a moving
# average and decodes share the steps, so the estimate errs.
HEADROOM = 0.8


class TtftSloAdmission:
    """An AdmissionController that also refuses requests predicted to miss the TTFT SLO."""

    def __init__(
        self,
        inner: AdmissionController,
        ttft_slo_s: float,
        stats: Callable[[], SchedulerStats],
    ) -> None:
        if not ttft_slo_s > 0:
            raise ValueError(f"--ttft-slo must be > 0 seconds, got {ttft_slo_s}")
        self.inner = inner
        self.ttft_slo_s = ttft_slo_s
        self.stats = stats
        self.num_queued_prompt_tokens = 0
        self.num_refused = 0
        self._queued: dict[str, int] = {}

    def __getattr__(self, name: str):
        # Everything else (bounds, counters) is the wrapped controller's.
        return getattr(self.inner, name)

    def predicted_ttft(self, num_tokens: int) -> float | None:
        """Seconds until a new request of num_tokens prompt tokens gets its first token; None
        while the engine has measured no prefill rate."""
        rate = self.stats().prefill_tokens_per_s
        if rate <= 0:
            return None
        return (self.num_queued_prompt_tokens + num_tokens) / rate

    def check(self, num_sequences: int, num_tokens: int) -> None:
        """Raise QueueFullError when the queue bounds or the TTFT SLO say no."""
        self.inner.check(num_sequences, num_tokens)
        self._check_slo(num_tokens)

    def admit(self, request_id: str, num_sequences: int, num_tokens: int) -> None:
        self._check_slo(num_tokens)
        self.inner.admit(request_id, num_sequences, num_tokens)
        self._queued[request_id] = num_tokens
        self.num_queued_prompt_tokens += num_tokens

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)
        num_tokens = self._queued.pop(request_id, None)
        if num_tokens is not None:
            self.num_queued_prompt_tokens -= num_tokens

    def _check_slo(self, num_tokens: int) -> None:
        if self.num_queued_prompt_tokens == 0:
            return
        predicted = self.predicted_ttft(num_tokens)
        limit = self.ttft_slo_s * HEADROOM
        if predicted is None or predicted <= limit:
            return
        rate = self.stats().prefill_tokens_per_s
        # Wait until the queue ahead has drained to what the SLO leaves room for.
        excess_tokens = self.num_queued_prompt_tokens + num_tokens - limit * rate
        retry_after = max(1, math.ceil(excess_tokens / rate))
        self.num_refused += 1
        message = (
            f"predicted time to first token {predicted:.2f}s exceeds the TTFT SLO "
            f"{self.ttft_slo_s:g}s ({self.num_queued_prompt_tokens} prompt tokens queued ahead, "
            f"prefill {rate:.0f} tokens/s); retry after {retry_after}s"
        )
        raise QueueFullError(message, retry_after_seconds=retry_after)
