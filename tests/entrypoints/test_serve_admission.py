"""The bounded queue in front of the engine: bounds, requests that can never fit, Retry-After
from the measured drain rate, and first come, first served among refused requests."""

from __future__ import annotations

import pytest

from ladle.frontend.admission import (
    MAX_RETRY_AFTER_SECONDS,
    AdmissionController,
    QueueFullError,
    QueueLimitError,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_request_bound():
    admission = AdmissionController(max_queued_requests=3, max_queued_tokens=None)
    admission.admit("a", 2, 10)
    admission.admit("b", 1, 10)
    with pytest.raises(QueueFullError, match="max_queued_requests=3") as caught:
        admission.admit("c", 1, 10)
    assert caught.value.retry_after_seconds >= 1
    admission.release("a")
    admission.release("a")  # idempotent
    admission.admit("c", 2, 10)
    assert admission.num_queued_requests == 3


def test_a_request_that_can_never_fit_is_refused_for_good():
    """Issue 7: 3 prompts x n=2 against max_queued_requests=4 was a 429 'retry later' on an idle
    server; it can never fit, so it is a QueueLimitError (a 400 naming the limit)."""
    admission = AdmissionController(max_queued_requests=4, max_queued_tokens=100)
    with pytest.raises(QueueLimitError, match="max_queued_requests=4"):
        admission.check(6, 12)
    with pytest.raises(QueueLimitError, match="max_queued_tokens=100"):
        admission.check(1, 500)
    admission.check(4, 100)  # exactly the bounds: fits an empty queue
    assert admission.num_queued_requests == admission.num_queued_tokens == 0


def test_token_bound():
    admission = AdmissionController(max_queued_requests=None, max_queued_tokens=100)
    admission.admit("a", 1, 60)
    with pytest.raises(QueueFullError, match="max_queued_tokens=100"):
        admission.check(1, 41)
    admission.check(1, 40)
    assert admission.num_queued_tokens == 60


def test_retry_after_follows_the_measured_drain_rate():
    clock = FakeClock()
    admission = AdmissionController(max_queued_requests=10, max_queued_tokens=None, clock=clock)
    for index in range(10):
        admission.admit(f"r{index}", 1, 1)
    # Nothing drained yet: the shortest honest wait.
    with pytest.raises(QueueFullError) as caught:
        admission.check(1, 1)
    assert caught.value.retry_after_seconds == 1
    # Two sequences leave in 10 s: 0.2 per second, so 5 s per place needed.
    clock.now += 5
    admission.release("r0")
    clock.now += 5
    admission.release("r1")
    admission.admit("r10", 1, 1)
    admission.admit("r11", 1, 1)
    with pytest.raises(QueueFullError) as caught:
        admission.check(3, 3, key="big")  # 3 places must free up
    assert caught.value.retry_after_seconds == 15
    # A queue that barely drains caps the wait, so clients never give up for good.
    clock.now += 9.5
    with pytest.raises(QueueFullError) as caught:
        admission.check(10, 10, key="huge")
    assert caught.value.retry_after_seconds == MAX_RETRY_AFTER_SECONDS


def test_refused_requests_are_served_first_come_first_served():
    """Issue 7: clients retrying as told were starved by newcomers. A refusal keeps the
    request's place: room that frees up goes to the earliest refused request that returns."""
    clock = FakeClock()
    admission = AdmissionController(max_queued_requests=2, max_queued_tokens=None, clock=clock)
    admission.admit("running-1", 1, 1)
    admission.admit("running-2", 1, 1)
    for key in ("first", "second"):
        with pytest.raises(QueueFullError):
            admission.check(1, 1, key=key)
    admission.release("running-1")  # one place frees up
    with pytest.raises(QueueFullError, match="refused earlier go first"):
        admission.check(1, 1, key="newcomer")
    with pytest.raises(QueueFullError):
        admission.check(1, 1, key="second")  # "first" is owed the place
    admission.check(1, 1, key="first")
    admission.admit("first-request", 1, 1, checked=True)
    admission.release("running-2")
    with pytest.raises(QueueFullError):
        admission.check(1, 1, key="newcomer")
    admission.check(1, 1, key="second")
    admission.admit("second-request", 1, 1, checked=True)
    assert admission.num_reservations == 1  # the newcomer's, now first in line


def test_a_place_is_given_up_when_its_owner_does_not_come_back():
    clock = FakeClock()
    admission = AdmissionController(max_queued_requests=1, max_queued_tokens=None, clock=clock)
    admission.admit("running", 1, 1)
    with pytest.raises(QueueFullError) as caught:
        admission.check(1, 1, key="gone")
    admission.release("running")
    with pytest.raises(QueueFullError):
        admission.check(1, 1, key="newcomer")
    clock.now += caught.value.retry_after_seconds + 10
    admission.check(1, 1, key="newcomer")


def test_bounds_are_validated():
    with pytest.raises(ValueError, match="max_queued_requests"):
        AdmissionController(0, None)
    with pytest.raises(ValueError, match="max_queued_tokens"):
        AdmissionController(None, -1)
