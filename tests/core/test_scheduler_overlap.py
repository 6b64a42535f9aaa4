"""The scheduler with overlapped steps: the next step is scheduled before the one in flight is
read. Tokens of launched steps are pending; a request ending by length is not scheduled past its
last token; a request that stops on EOS while its next step is in flight reports nothing more;
a request preempted while its step runs takes its token and resumes from it."""

from __future__ import annotations

from request_factory import computed_before, granted, one_token_each, output_indices
from test_scheduler import EOS, make_request, make_scheduler

from ladle.core.request import RequestStatus


def test_next_step_is_scheduled_while_the_token_is_pending():
    scheduler = make_scheduler()
    request = make_request("a", num_prompt_tokens=5, max_tokens=3, ignore_eos=True)
    scheduler.add_request(request)
    first = scheduler.schedule()  # the prompt
    assert granted(first) == {"a": 5} and output_indices(first) == {"a": 0}
    second = scheduler.schedule()  # step 1 still unread: decode its pending token
    assert granted(second) == {"a": 1}
    assert computed_before(second) == {"a": 5} and output_indices(second) == {"a": 1}
    assert request.num_pending_tokens == 2 and request.num_computed_tokens == 6
    third = scheduler.schedule()
    assert output_indices(third) == {"a": 2}
    # Three tokens pending = max_tokens: a fourth step would only be thrown away.
    assert not scheduler.schedule().scheduled
    outputs = []
    for step, token in zip((first, second, third), (11, 12, 13)):
        outputs += scheduler.update_from_output(step, one_token_each(step, [token]))
    assert [o.new_token_ids[0] for o in outputs] == [11, 12, 13]
    assert outputs[-1].finish_reason == "length"
    assert request.output_token_ids == [11, 12, 13] and request.num_pending_tokens == 0
    assert (
        scheduler.kv_cache_manager.num_free_blocks
        == scheduler.kv_cache_manager.block_pool.num_usable_blocks
    )


def test_a_request_stopping_in_flight_reports_no_more_tokens():
    scheduler = make_scheduler()
    stopping = make_request("stop", num_prompt_tokens=4, max_tokens=10)
    other = make_request("other", num_prompt_tokens=4, max_tokens=10, first_token=30)
    scheduler.add_request(stopping)
    scheduler.add_request(other)
    first = scheduler.schedule()
    second = scheduler.schedule()  # both decode their pending tokens
    assert [r.request_id for r in second.scheduled] == ["stop", "other"]
    outputs = scheduler.update_from_output(first, one_token_each(first, [EOS, 5]))
    assert [(o.request_id, o.finish_reason) for o in outputs] == [("stop", "stop"), ("other", None)]
    third = scheduler.schedule()  # the stopped request is gone; its place in step 2 is wasted
    assert [r.request_id for r in third.scheduled] == ["other"]
    outputs = scheduler.update_from_output(second, one_token_each(second, [6, 7]))
    assert [(o.request_id, o.new_token_ids) for o in outputs] == [("other", [7])]
    assert stopping.output_token_ids == [EOS]


def test_a_request_preempted_while_its_step_runs_keeps_its_token():
    # 4 usable blocks of 4 tokens: two requests of 8 prompt tokens hold 2 blocks each; the next
    # decode of the first needs a third block, so the newest request is preempted.
    scheduler = make_scheduler(num_blocks=5, budget=32)
    old = make_request("old", num_prompt_tokens=8, max_tokens=4, arrival=0.0, ignore_eos=True)
    new = make_request(
        "new", num_prompt_tokens=8, max_tokens=4, arrival=1.0, ignore_eos=True, first_token=40
    )
    scheduler.add_request(old)
    scheduler.add_request(new)
    first = scheduler.schedule()
    second = scheduler.schedule()  # old's token 9 needs a new block: new is preempted
    assert second.preempted_request_ids == ["new"]
    assert new.status == RequestStatus.PREEMPTED and new.num_pending_tokens == 1
    scheduler.update_from_output(first, one_token_each(first, [21, 22]))
    assert new.output_token_ids == [22] and new.num_pending_tokens == 0
    assert new.num_computed_tokens == 0  # recomputed from its host tokens once resumed
    scheduler.update_from_output(second, one_token_each(second, [23]))
    assert old.output_token_ids == [21, 23]
    while scheduler.has_unfinished_requests():
        output = scheduler.schedule()
        scheduler.update_from_output(output, one_token_each(output, [9] * len(output.scheduled)))
    assert new.output_token_ids == [22, 9, 9, 9] and old.output_token_ids == [21, 23, 9, 9]
