"""The live view of `ladle serve`: one stats line every few seconds while busy, and a line when a
request is refused, saying why.

    [ladle] running 12 reqs, waiting 30 reqs, KV cache 41.2%, prefix cache hit rate 63.0%,
            prompt 5120.4 tokens/s, generation 812.5 tokens/s, refused 7

(one line in the log). With speculative decoding on, an interval that verified drafts adds vLLM's
line, under vLLM's wording (so what reads vLLM's logs reads these):

    [ladle] SpecDecoding metrics: Mean acceptance length: 2.03, Accepted throughput: 1210.40
            tokens/s, Drafted throughput: 2875.20 tokens/s, Accepted: 6052 tokens, Drafted: 14376
            tokens, Per-position acceptance rate: 0.601, 0.362, 0.221, 0.130, Avg Draft
            acceptance rate: 42.1%

Figures are over the last interval, from the engine's stats snapshot, which arrives with every
step. Refusals are logged as they happen, at most one line a second;
the rest are counted into the next stats line, so overload does not flood the log.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

from ladle.protocol.messages import SchedulerStats, SpecDecodeStats

REFUSAL_LOG_INTERVAL_S = 1.0


def _print(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


class LiveStatsLogger:
    """Formats and writes the periodic stats line and the refusal lines."""

    def __init__(
        self,
        stats: Callable[[], SchedulerStats],
        interval_s: float = 5.0,
        write: Callable[[str], None] = _print,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stats = stats
        self.interval_s = interval_s
        self.write = write
        self.clock = clock
        self._previous = stats()
        self._previous_time = clock()
        self._num_refused = 0
        self._last_refusal_logged = -float("inf")

    def record_refusal(self, status: int, message: str) -> None:
        """A request was refused (429 or 4xx before reaching the engine)."""
        self._num_refused += 1
        now = self.clock()
        if now - self._last_refusal_logged >= REFUSAL_LOG_INTERVAL_S:
            self._last_refusal_logged = now
            self.write(f"[ladle] refused a request ({status}): {message}")

    def line(self) -> str | None:
        """The stats line for the interval since the last call; None when the engine was idle."""
        stats, now = self.stats(), self.clock()
        previous, elapsed = self._previous, max(now - self._previous_time, 1e-9)
        self._previous, self._previous_time = stats, now
        num_refused, self._num_refused = self._num_refused, 0
        prompt_tokens = stats.num_prefill_tokens - previous.num_prefill_tokens
        generated_tokens = stats.num_decode_tokens - previous.num_decode_tokens
        busy = stats.num_running_reqs or stats.num_waiting_reqs
        if not (busy or prompt_tokens or generated_tokens or num_refused):
            return None
        queries = stats.prefix_cache_queries - previous.prefix_cache_queries
        hits = stats.prefix_cache_hits - previous.prefix_cache_hits
        hit_rate = f"{hits / queries:.1%}" if queries else "-"
        text = (
            f"[ladle] running {stats.num_running_reqs} reqs, waiting {stats.num_waiting_reqs} "
            f"reqs, KV cache {stats.kv_cache_usage:.1%}, prefix cache hit rate {hit_rate}, "
            f"prompt {prompt_tokens / elapsed:.1f} tokens/s, "
            f"generation {generated_tokens / elapsed:.1f} tokens/s"
        )
        if num_refused:
            text += f", refused {num_refused}"
        if stats.spec_decode is not None:
            spec = _spec_decode_line(stats.spec_decode, previous.spec_decode, elapsed)
            if spec is not None:
                text += "\n" + spec
        return text

    async def run(self) -> None:
        """Write a line every interval while busy; runs until cancelled."""
        while True:
            await asyncio.sleep(self.interval_s)
            line = self.line()
            if line is not None:
                self.write(line)


def _spec_decode_line(
    now: SpecDecodeStats, before: SpecDecodeStats | None, elapsed: float
) -> str | None:
    """vLLM's SpecDecoding metrics line over the interval; None when nothing was verified."""
    num_drafts = now.num_drafts - (before.num_drafts if before else 0)
    if num_drafts <= 0:
        return None
    drafted = now.num_draft_tokens - (before.num_draft_tokens if before else 0)
    accepted = now.num_accepted_tokens - (before.num_accepted_tokens if before else 0)
    per_position = [
        (count - (before.num_accepted_tokens_per_pos[i] if before else 0)) / num_drafts
        for i, count in enumerate(now.num_accepted_tokens_per_pos)
    ]
    rate = accepted / drafted if drafted else 0.0
    return (
        f"[ladle] SpecDecoding metrics: Mean acceptance length: {1 + accepted / num_drafts:.2f}, "
        f"Accepted throughput: {accepted / elapsed:.2f} tokens/s, "
        f"Drafted throughput: {drafted / elapsed:.2f} tokens/s, "
        f"Accepted: {accepted} tokens, Drafted: {drafted} tokens, "
        f"Per-position acceptance rate: {', '.join(f'{p:.3f}' for p in per_position)}, "
        f"Avg Draft acceptance rate: {rate:.1%}"
    )
