"""worker/step_events.py: the kept Stream object is the current stream's, under a stream context
too, and an event recorded through it waits for the work queued before it there."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_current_stream_follows_stream_contexts():
    from ladle.worker.step_events import current_stream

    index = torch.cuda.current_device()
    assert current_stream(index) == torch.cuda.current_stream(index)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert current_stream(index) == side
    assert current_stream(index) == torch.cuda.current_stream(index)


def test_recorded_event_covers_the_work_before_it():
    from ladle.worker.step_events import record_event

    x = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()
    event = torch.cuda.Event()
    with torch.cuda.stream(side):
        for _ in range(20):
            y = x @ x
        record_event(event, torch.device("cuda"))
    event.synchronize()
    assert side.query()  # everything queued on the side stream before the event is done
    assert torch.isfinite(y).all()
