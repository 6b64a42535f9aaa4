"""Admission control: a bounded queue in front of the engine, so overload answers 429 at once
instead of growing a queue without end (and latency with it).

A sequence counts as queued from the moment the API process sends it to the engine until its
first output comes back (its prompt is computed and it is decoding), or until it ends some
other way (error, abort, disconnect, engine death): the client releases the entry on every
path out, and `release` is idempotent, so the counts cannot leak. A prompt being prefilled in
chunks still counts as queued, which errs on the side of refusing.

Three promises to clients:
- A request that could never fit the bounds (more sequences than max_queued_requests, more
  prompt tokens than max_queued_tokens) is refused for good (QueueLimitError, a 400 naming the
  limit), not told to retry.
- Retry-After is the time the measured drain rate (sequences leaving the queue per second over
  the last few seconds) needs to make room for the request, not a constant.
- Refused requests are served first come, first served: a refusal reserves the request's place
  (keyed by `retry_key`, a hash of the client and its body) for a while, and newcomers are
  refused while the room is owed to earlier refused requests that come back.
"""

from __future__ import annotations

import collections
import contextvars
import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

# Bounds on the Retry-After we state: at least a second, and never so long a client gives up.
MIN_RETRY_AFTER_SECONDS = 1
MAX_RETRY_AFTER_SECONDS = 60
# The window the drain rate is measured over.
DRAIN_WINDOW_SECONDS = 10.0
# A refused request keeps its place this long past its Retry-After, then it counts as gone.
RESERVATION_GRACE_SECONDS = 5.0
# Places kept at most (memory bound under a flood of distinct refused requests).
MAX_RESERVATIONS = 4096

# The retry key of the request being handled: set by the HTTP route, read by check(). A context
# variable, so each request's task sees its own.
current_retry_key: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "ladle_admission_retry_key", default=None
)


def retry_key(client: str, body: bytes) -> str:
    """Who asks and what: a request retried as told has the same key."""
    return hashlib.blake2b(client.encode() + b"\0" + body, digest_size=16).hexdigest()


class QueueFullError(Exception):
    """The waiting queue is at its bound; the client should retry after retry_after_seconds."""

    def __init__(self, message: str, retry_after_seconds: int = MIN_RETRY_AFTER_SECONDS) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class QueueLimitError(ValueError):
    """The request alone exceeds a queue bound: it can never be admitted (a 400, not a 429)."""


@dataclass
class _Entry:
    num_sequences: int
    num_tokens: int


@dataclass
class _Reservation:
    key: str
    num_sequences: int
    num_tokens: int
    expires_at: float


class DrainRate:
    """Sequences leaving the queue per second, over the last DRAIN_WINDOW_SECONDS."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._events: collections.deque[tuple[float, int]] = collections.deque()
        self._started = clock()

    def record(self, num_sequences: int) -> None:
        self._events.append((self._clock(), num_sequences))

    def per_second(self) -> float | None:
        """None until anything has drained in the window."""
        now = self._clock()
        while self._events and self._events[0][0] < now - DRAIN_WINDOW_SECONDS:
            self._events.popleft()
        if not self._events:
            return None
        span = min(DRAIN_WINDOW_SECONDS, max(now - self._started, 1e-3))
        return sum(count for _, count in self._events) / span


class AdmissionController:
    """Counts queued sequences and their prompt tokens against two optional bounds."""

    def __init__(
        self,
        max_queued_requests: int | None,
        max_queued_tokens: int | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_queued_requests is not None and max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {max_queued_requests}")
        if max_queued_tokens is not None and max_queued_tokens < 1:
            raise ValueError(f"max_queued_tokens must be >= 1, got {max_queued_tokens}")
        self.max_queued_requests = max_queued_requests
        self.max_queued_tokens = max_queued_tokens
        self.num_queued_requests = 0
        self.num_queued_tokens = 0
        self._entries: dict[str, _Entry] = {}
        self._reservations: list[_Reservation] = []
        self._clock = clock
        self.drain_rate = DrainRate(clock)

    @property
    def num_reservations(self) -> int:
        return len(self._reservations)

    def check(self, num_sequences: int, num_tokens: int, key: str | None = None) -> None:
        """Raise QueueLimitError if the request can never fit, QueueFullError unless it fits
        now (after the places owed to requests refused before it). key: the request's retry key
        (default: the one the HTTP route set for this request)."""
        self._check_can_ever_fit(num_sequences, num_tokens)
        key = key if key is not None else current_retry_key.get()
        now = self._clock()
        self._reservations = [r for r in self._reservations if r.expires_at > now]
        place = next(
            (i for i, r in enumerate(self._reservations) if key is not None and r.key == key),
            len(self._reservations),
        )
        ahead = self._reservations[:place]
        owed_sequences = sum(r.num_sequences for r in ahead)
        owed_tokens = sum(r.num_tokens for r in ahead)
        excess_sequences = excess_tokens = 0
        if self.max_queued_requests is not None:
            excess_sequences = (
                self.num_queued_requests + owed_sequences + num_sequences - self.max_queued_requests
            )
        if self.max_queued_tokens is not None:
            excess_tokens = (
                self.num_queued_tokens + owed_tokens + num_tokens - self.max_queued_tokens
            )
        if excess_sequences <= 0 and excess_tokens <= 0:
            if place < len(self._reservations):
                del self._reservations[place]
            return
        retry_after = self._retry_after(excess_sequences)
        if place < len(self._reservations):
            self._reservations[place].expires_at = now + retry_after + RESERVATION_GRACE_SECONDS
        elif key is not None and len(self._reservations) < MAX_RESERVATIONS:
            self._reservations.append(
                _Reservation(key, num_sequences, num_tokens,
                             now + retry_after + RESERVATION_GRACE_SECONDS)
            )
        if excess_sequences > 0:
            what = (f"{self.num_queued_requests} sequences waiting, max_queued_requests="
                    f"{self.max_queued_requests}")
        else:
            what = (f"{self.num_queued_tokens} prompt tokens waiting, max_queued_tokens="
                    f"{self.max_queued_tokens}")
        owed = f", {len(ahead)} refused earlier go first" if ahead else ""
        raise QueueFullError(
            f"the server's queue is full ({what}{owed}); retry after {retry_after}s",
            retry_after_seconds=retry_after,
        )

    def _check_can_ever_fit(self, num_sequences: int, num_tokens: int) -> None:
        if self.max_queued_requests is not None and num_sequences > self.max_queued_requests:
            raise QueueLimitError(
                f"the request needs {num_sequences} sequences (prompts x n) at once, more than "
                f"the server queues (max_queued_requests={self.max_queued_requests}); send "
                f"fewer prompts or a smaller n per request"
            )
        if self.max_queued_tokens is not None and num_tokens > self.max_queued_tokens:
            raise QueueLimitError(
                f"the request needs {num_tokens} prompt tokens (prompts x n) at once, more than "
                f"the server queues (max_queued_tokens={self.max_queued_tokens}); send a "
                f"shorter prompt, fewer prompts or a smaller n per request"
            )

    def _retry_after(self, excess_sequences: int) -> int:
        """Seconds until the measured drain makes room for what must leave the queue first."""
        rate = self.drain_rate.per_second()
        if rate is None:
            return MIN_RETRY_AFTER_SECONDS
        needed = max(excess_sequences, 1)
        seconds = math.ceil(needed / rate)
        return max(MIN_RETRY_AFTER_SECONDS, min(MAX_RETRY_AFTER_SECONDS, seconds))

    def admit(
        self, request_id: str, num_sequences: int, num_tokens: int, checked: bool = False
    ) -> None:
        """check() (unless the caller just did, for a batch), then count the request as queued
        until release(request_id)."""
        if not checked:
            self.check(num_sequences, num_tokens)
        self._entries[request_id] = _Entry(num_sequences, num_tokens)
        self.num_queued_requests += num_sequences
        self.num_queued_tokens += num_tokens

    def release(self, request_id: str) -> None:
        """The request started (or ended, however it ended); idempotent."""
        entry = self._entries.pop(request_id, None)
        if entry is not None:
            self.num_queued_requests -= entry.num_sequences
            self.num_queued_tokens -= entry.num_tokens
            self.drain_rate.record(entry.num_sequences)
