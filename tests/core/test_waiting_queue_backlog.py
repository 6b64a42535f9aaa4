"""WaitingQueue.has_more_prompt_tokens_than: the prompt tokens still to compute of the live
waiting requests (a preempted one counts what it has left; aborted ones count nothing), which
the scheduler compares with a step's token budget before it lets a step speculate."""

from __future__ import annotations

from request_factory import make_request

from ladle.core.request import RequestStatus
from ladle.core.waiting_queue import WaitingQueue


def test_counts_the_prompt_tokens_left_of_live_requests():
    queue = WaitingQueue()
    first, second, aborted = (make_request(name, list(range(100))) for name in "abc")
    second.num_computed_tokens = 40  # chunked part-way before a preemption
    for request in (first, second, aborted):
        queue.push(request)
    aborted.status = RequestStatus.FINISHED_ABORTED
    queue.discard(aborted)
    assert queue.has_more_prompt_tokens_than(159)  # 100 + 60
    assert not queue.has_more_prompt_tokens_than(160)
    assert not WaitingQueue().has_more_prompt_tokens_than(0)
