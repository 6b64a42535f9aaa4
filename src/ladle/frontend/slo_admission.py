"""TTFT-SLO admission: refuse at once the requests that could not get their first token in time.

Without it, overload lets every request into the queue and every one of them misses the SLO.
With `ladle serve --ttft-slo`, each new request's time to first token is predicted from the
prompt tokens already queued ahead of it (sent to the engine, first token not yet back) plus its
own, divided by the engine's measured prefill rate (engine/step_meter.py, sent with every step's
stats). A request predicted past the SLO (with a margin for the estimate's error) gets 429 with a
Retry-After of the time the queue needs to drain enough for it; the requests let in meet the SLO.

When the engine's running batch is full (max_num_seqs running), a queued request waits for
running ones to finish, not for prefill compute: the prompt-token prediction alone would then
admit everything (a slow-draining queue of short prompts looks fast). So the prediction is also
the queue-position wait, (requests queued ahead + 1) / the measured rate at which queued
requests start (AdmissionController.drain_rate), and the larger of the two counts.

Two cases are always let in: nothing queued ahead (refusing would not make it faster: a prompt
too long for the SLO on its own still gets served), and no measured rate yet (no prediction).

It wraps the queue-bound AdmissionController with the same check / admit / release calls, so the
engine client and the routes need no change; it keeps its own count of the queued tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ladle.frontend.admission import MAX_RETRY_AFTER_SECONDS, AdmissionController, QueueFullError
from ladle.protocol.messages import SchedulerStats

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
        max_num_seqs: int | None = None,
    ) -> None:
        """max_num_seqs: the engine's running-batch bound (None: never treat the batch as full,
        the prompt-token prediction alone)."""
        if not ttft_slo_s > 0:
            raise ValueError(f"--ttft-slo must be > 0 seconds, got {ttft_slo_s}")
        self.max_num_seqs = max_num_seqs
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
        return max((self.num_queued_prompt_tokens + num_tokens) / rate, self.slot_wait())

    def batch_full(self) -> bool:
        return self.max_num_seqs is not None and self.stats().num_running_reqs >= self.max_num_seqs

    def slot_wait(self) -> float:
        """Seconds a new request waits for a place in a full running batch: the requests queued
        ahead and itself must start, at the rate queued requests have been starting (infinite
        when none started lately); 0 while the batch has room."""
        if not self.batch_full():
            return 0.0
        started_per_s = self.inner.drain_rate.per_second()
        if not started_per_s:
            return math.inf
        return (self.inner.num_queued_requests + 1) / started_per_s

    def check(self, num_sequences: int, num_tokens: int, key: str | None = None) -> None:
        """Raise QueueFullError when the queue bounds or the TTFT SLO say no (QueueLimitError
        when the request can never fit the bounds)."""
        self.inner.check(num_sequences, num_tokens, key)
        self._check_slo(num_tokens)

    def admit(
        self, request_id: str, num_sequences: int, num_tokens: int, checked: bool = False
    ) -> None:
        """checked: the caller just ran check() for the batch this request belongs to."""
        if not checked:
            self._check_slo(num_tokens)
        self.inner.admit(request_id, num_sequences, num_tokens, checked=checked)
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
        slot_wait = self.slot_wait()
        if slot_wait >= predicted:  # a full batch, not prefill, makes it late
            # Wait until enough queued requests have started for this one to start in time.
            excess_s = slot_wait - limit
            retry_after = MAX_RETRY_AFTER_SECONDS
            if math.isfinite(excess_s):
                retry_after = min(retry_after, max(1, math.ceil(excess_s)))
            why = (
                f"running batch full ({self.stats().num_running_reqs} of max_num_seqs "
                f"{self.max_num_seqs}), {self.inner.num_queued_requests} requests queued ahead, "
                f"{self.inner.drain_rate.per_second() or 0:.2f} starting per second"
            )
        else:
            # Wait until the queue ahead has drained to what the SLO leaves room for.
            excess_tokens = self.num_queued_prompt_tokens + num_tokens - limit * rate
            retry_after = max(1, math.ceil(excess_tokens / rate))
            why = (
                f"{self.num_queued_prompt_tokens} prompt tokens queued ahead, "
                f"prefill {rate:.0f} tokens/s"
            )
        self.num_refused += 1
        message = (
            f"predicted time to first token {predicted:.2f}s exceeds the TTFT SLO "
            f"{self.ttft_slo_s:g}s ({why}); retry after {retry_after}s"
        )
        raise QueueFullError(message, retry_after_seconds=retry_after)
