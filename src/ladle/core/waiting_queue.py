"""The scheduler's waiting queue: requests by (priority, arrival time)."""

from __future__ import annotations

import heapq
import itertools

from ladle.core.request import Request


class WaitingQueue:
    """Waiting requests ordered by (priority, arrival time); lower priority values run first.

    A heap with lazy deletion: an aborted request is only marked and skipped when it surfaces.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._order = itertools.count()
        self._num_live = 0

    def readmit(self, request: Request) -> None:
        """Push a request back that left the queue without being scheduled (it waited for its
        KV): its (priority, arrival) key puts it back where it was."""
        self.push(request)

    def push(self, request: Request) -> None:
        heapq.heappush(
            self._heap, (request.priority, request.arrival_time, next(self._order), request)
        )
        self._num_live += 1

    def peek(self) -> Request | None:
        while self._heap and self._heap[0][3].is_finished:
            heapq.heappop(self._heap)
        return self._heap[0][3] if self._heap else None

    def pop(self) -> Request:
        request = self.peek()
        assert request is not None
        heapq.heappop(self._heap)
        self._num_live -= 1
        return request

    def discard(self, request: Request) -> None:
        """Called after the request was marked finished; the heap entry goes lazily."""
        self._num_live -= 1

    def has_more_prompt_tokens_than(self, limit: int) -> bool:
        """Whether the waiting requests' prompt tokens still to compute exceed limit (stops
        counting once they do)."""
        total = 0
        for _, _, _, request in self._heap:
            if not request.is_finished:
                total += request.num_prompt_tokens - request.num_computed_tokens
                if total > limit:
                    return True
        return False

    def __len__(self) -> int:
        return self._num_live
