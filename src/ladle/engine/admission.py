"""Admission control: a bounded queue in front of the engine, so overload answers 429 at once
instead of growing a queue without end (and latency with it).

A sequence counts as queued from the moment the API process sends it to the engine until its
first output comes back (its prompt is computed and it is decoding). That is the API process's
own exact count, with no lag behind the engine's stats messages; a prompt being prefilled in
chunks still counts as queued, which errs on the side of refusing.
"""

from __future__ import annotations

from dataclasses import dataclass

RETRY_AFTER_SECONDS = 1


class QueueFullError(Exception):
    """The waiting queue is at its bound; the client should retry later."""

    def __init__(self, message: str, retry_after_seconds: int = RETRY_AFTER_SECONDS) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


@dataclass
class _Entry:
    num_sequences: int
    num_tokens: int


class AdmissionController:
    """Counts queued sequences and their prompt tokens against two optional bounds.

    A request that fits no bound on its own is still admitted when nothing is queued, so a
    single long prompt is never refused forever; the bounds cap how much waits, not its size.
    """

    def __init__(self, max_queued_requests: int | None, max_queued_tokens: int | None) -> None:
        if max_queued_requests is not None and max_queued_requests < 1:
            raise ValueError(f"max_queued_requests must be >= 1, got {max_queued_requests}")
        if max_queued_tokens is not None and max_queued_tokens < 1:
            raise ValueError(f"max_queued_tokens must be >= 1, got {max_queued_tokens}")
        self.max_queued_requests = max_queued_requests
        self.max_queued_tokens = max_queued_tokens
        self.num_queued_requests = 0
        self.num_queued_tokens = 0
        self._entries: dict[str, _Entry] = {}

    def check(self, num_sequences: int, num_tokens: int) -> None:
        """Raise QueueFullError unless this many more sequences and tokens fit now."""
        if self.num_queued_requests == 0:
            return
        if (
            self.max_queued_requests is not None
            and self.num_queued_requests + num_sequences > self.max_queued_requests
        ):
            raise QueueFullError(
                f"the server's queue is full ({self.num_queued_requests} requests waiting, "
                f"max_queued_requests={self.max_queued_requests}); retry later"
            )
        if (
            self.max_queued_tokens is not None
            and self.num_queued_tokens + num_tokens > self.max_queued_tokens
        ):
            raise QueueFullError(
                f"the server's queue is full ({self.num_queued_tokens} prompt tokens waiting, "
                f"max_queued_tokens={self.max_queued_tokens}); retry later"
            )

    def admit(self, request_id: str, num_sequences: int, num_tokens: int) -> None:
        """check(), then count the request as queued until release(request_id)."""
        self.check(num_sequences, num_tokens)
        self._entries[request_id] = _Entry(num_sequences, num_tokens)
        self.num_queued_requests += num_sequences
        self.num_queued_tokens += num_tokens

    def release(self, request_id: str) -> None:
        """The request started (or ended); idempotent."""
        entry = self._entries.pop(request_id, None)
        if entry is not None:
            self.num_queued_requests -= entry.num_sequences
            self.num_queued_tokens -= entry.num_tokens
