"""The bounded queue in front of the engine."""

from __future__ import annotations

import pytest

from ladle.engine.admission import AdmissionController, QueueFullError


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


def test_token_bound_and_lone_oversized_request():
    admission = AdmissionController(max_queued_requests=None, max_queued_tokens=100)
    admission.admit("big", 1, 500)  # alone: admitted, or it could never run
    with pytest.raises(QueueFullError, match="max_queued_tokens=100"):
        admission.admit("small", 1, 1)
    admission.release("big")
    admission.admit("a", 1, 60)
    with pytest.raises(QueueFullError):
        admission.check(1, 41)
    admission.check(1, 40)
    assert admission.num_queued_tokens == 60


def test_bounds_are_validated():
    with pytest.raises(ValueError, match="max_queued_requests"):
        AdmissionController(0, None)
    with pytest.raises(ValueError, match="max_queued_tokens"):
        AdmissionController(None, -1)
