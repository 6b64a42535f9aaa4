"""A request's pending outputs merge when its reader falls behind, and snapshots are immune to
the OutputProcessor reusing its objects."""

from __future__ import annotations

import asyncio

import pytest

from ladle.frontend.client import EngineDeadError, _OutputBuffer, _snapshot
from ladle.outputs import CompletionOutput, RequestMetrics, RequestOutput


def step_output(text: str, token_id: int, finished: bool = False) -> RequestOutput:
    completions = [
        CompletionOutput(index=i, text_delta=f"{text}{i}", token_ids_delta=[token_id + i],
                         finish_reason="length" if finished else None)
        for i in range(2)
    ]
    return RequestOutput("r", None, [1], completions, finished=finished,
                         metrics=RequestMetrics(arrival_time=0.0))


def test_pending_outputs_merge_in_order():
    async def scenario():
        buffer = _OutputBuffer()
        buffer.put(step_output("a", 10))
        buffer.put(step_output("b", 20))
        buffer.put(step_output("c", 30, finished=True))
        return await buffer.get()

    merged = asyncio.run(scenario())
    assert merged.finished
    assert [c.text_delta for c in merged.outputs] == ["a0b0c0", "a1b1c1"]
    assert [c.token_ids_delta for c in merged.outputs] == [[10, 20, 30], [11, 21, 31]]


def test_error_after_pending_outputs():
    async def scenario():
        buffer = _OutputBuffer()
        buffer.put(step_output("a", 1))
        buffer.fail(EngineDeadError("gone"))
        first = await buffer.get()
        with pytest.raises(EngineDeadError):
            await buffer.get()
        return first

    assert asyncio.run(scenario()).outputs[0].text_delta == "a0"


def test_snapshot_keeps_this_steps_deltas():
    live = step_output("a", 1)
    snapshot = _snapshot(live)
    live.outputs[0].token_ids_delta.clear()  # what the processor does at the next step
    live.outputs[0].text_delta = ""
    assert snapshot.outputs[0].token_ids_delta == [1]
    assert snapshot.outputs[0].text_delta == "a0"


def test_snapshot_is_a_copy_of_every_mutable_part():
    """What the processor changes in place at the next step (deltas, logprobs deltas, finish
    fields, metrics, the finished flag) must not reach a snapshot already handed out; the
    cumulative lists stay shared (they only grow)."""
    live = step_output("a", 1)
    live.outputs[0].logprobs_delta = ["lp"]
    snapshot = _snapshot(live)
    assert snapshot == live and snapshot is not live
    live.outputs[0].logprobs_delta.clear()
    live.outputs[1].finish_reason = "stop"
    live.metrics.first_token_time = 5.0
    live.finished = True
    assert snapshot.outputs[0].logprobs_delta == ["lp"]
    assert snapshot.outputs[1].finish_reason is None
    assert snapshot.metrics.first_token_time is None
    assert not snapshot.finished
    assert snapshot.outputs[0].token_ids is live.outputs[0].token_ids


def test_queued_steps_join_in_order_with_the_latest_stats():
    """The reader applies every queued step in one pass: outputs and rejections keep their
    order, so a request's tokens stay in sequence, and the newest stats win."""
    from ladle.frontend.client import _join_steps
    from ladle.protocol import wire
    from ladle.protocol.messages import EngineCoreOutput, SchedulerStats

    steps = [
        wire.EngineStep(
            outputs=[EngineCoreOutput("a", [1]), EngineCoreOutput("b", [7])],
            stats=SchedulerStats(num_running_reqs=2),
        ),
        wire.EngineStep(rejections=[wire.Rejection("c", "too long")]),
        wire.EngineStep(
            outputs=[EngineCoreOutput("a", [2], finish_reason="length")],
            stats=SchedulerStats(num_running_reqs=1),
        ),
    ]
    joined = _join_steps(steps)
    in_order = [(o.request_id, o.new_token_ids) for o in joined.outputs]
    assert in_order == [("a", [1]), ("b", [7]), ("a", [2])]
    assert [r.request_id for r in joined.rejections] == ["c"]
    assert joined.stats.num_running_reqs == 1


def test_joined_steps_give_one_output_per_request_with_all_tokens():
    """Through the OutputProcessor, a joined pass yields one RequestOutput per request whose
    deltas hold every step's tokens: one chunk to stream instead of several."""
    from ladle.frontend.output_processor import OutputProcessor
    from ladle.protocol.messages import EngineCoreOutput
    from ladle.sampling.params import SamplingParams

    processor = OutputProcessor(None, eos_token_ids=(0,))
    processor.add_request("a", None, [5, 6], SamplingParams(max_tokens=3), 0.0)
    outputs, _ = processor.process_outputs(
        [EngineCoreOutput("a", [1]), EngineCoreOutput("a", [2]), EngineCoreOutput("a", [3])]
    )
    assert len(outputs) == 1
    assert outputs[0].outputs[0].token_ids_delta == [1, 2, 3]
