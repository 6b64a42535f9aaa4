"""TokenGapMeter: the inter-token time a stream would see if the API process added nothing.

The engine-core loop sends one frame of outputs per step. A running stream's token leaves the
engine in such a frame, so the time it waited for it is the time since the frame that carried
its previous token: the engine loop's whole cycle (schedule, launch, read back, stats, encode,
send), not only the forward pass. The meter records that gap for every token a frame gives to a
stream that already had one (a first token is time to first token, not an inter-token gap).
When every running stream gets one token a step, the mean of these gaps is each step's cycle
time weighted by the tokens it gave to running streams; a stream that sat out some steps
(preempted, say) records the whole wait, as its client sees it. Tokens beyond the first in one
output arrive with it, so they record a gap of 0: the mean is then total wait / tokens, the
same as a client's time per output token.

It is what `ladle:engine_inter_token_latency_seconds` exports: set against the client's
inter-token times (`scripts/served_path_bench.py`) it says how much the API process and the
network add.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable

from ladle.protocol.messages import EngineCoreOutput

# Upper bounds (s) of the histogram: half-millisecond steps where decode steps live (so a p50
# read from the buckets is within ~0.5 ms), then coarser out to the stalls of a long prefill.
_FINE_BOUNDS_MS = tuple(half_ms / 2 for half_ms in range(1, 25))  # 0.5, 1.0 .. 12 ms
_COARSE_BOUNDS_MS = (14, 16, 18, 20, 25, 30, 40, 50, 75, 100, 150, 200, 300, 500, 1000, 2500)
ENGINE_ITL_BOUNDS_S = tuple(ms / 1000 for ms in (*_FINE_BOUNDS_MS, *_COARSE_BOUNDS_MS))


class TokenGapMeter:
    """Per-token engine-side gaps, accumulated as a histogram (counts per ENGINE_ITL_BOUNDS_S
    bucket, the last for slower than every bound) with their total seconds."""

    def __init__(self) -> None:
        self.bucket_counts = [0] * (len(ENGINE_ITL_BOUNDS_S) + 1)
        self.total_seconds = 0.0
        self.num_tokens = 0
        # When each unfinished stream's last token left; gone once it finishes.
        self._last_token_time: dict[str, float] = {}
        self._previous_frame_time: float | None = None

    def observe(self, outputs: Iterable[EngineCoreOutput], now: float) -> None:
        """Record the gaps of one frame of outputs, sent at `now` (seconds, any monotonic
        clock; the same one every call)."""
        last_token_time = self._last_token_time
        previous = self._previous_frame_time
        num_at_previous = 0  # the common case: one gap, now - previous, for many streams
        other_gaps: list[float] = []
        num_zero_gaps = 0
        gave_tokens = False
        for output in outputs:
            request_id = output.request_id
            num_new = len(output.new_token_ids)
            if num_new:
                gave_tokens = True
                num_zero_gaps += num_new - 1  # the tokens after the first of this output
                last = last_token_time.get(request_id)
                if last is None:
                    pass  # the stream's first token: no gap
                elif last == previous:
                    num_at_previous += 1
                else:
                    other_gaps.append(now - last)
                if output.finish_reason is None:
                    last_token_time[request_id] = now
                    continue
            if output.finish_reason is not None:
                last_token_time.pop(request_id, None)
        if num_at_previous:
            self._add(now - previous, num_at_previous)
        for gap in other_gaps:
            self._add(gap, 1)
        if num_zero_gaps:
            self._add(0.0, num_zero_gaps)
        if gave_tokens:  # a frame of aborts alone leaves every stream's last token where it was
            self._previous_frame_time = now

    def _add(self, seconds: float, count: int) -> None:
        self.bucket_counts[bisect.bisect_left(ENGINE_ITL_BOUNDS_S, seconds)] += count
        self.total_seconds += seconds * count
        self.num_tokens += count

    @property
    def num_open_streams(self) -> int:
        """Streams that have had a token and not finished (their last token time is kept)."""
        return len(self._last_token_time)
