"""A request's pending outputs merge when its reader falls behind, and snapshots are immune to
the OutputProcessor reusing its objects."""

from __future__ import annotations

import asyncio

import pytest

from ladle.engine.client import EngineDeadError, _OutputBuffer, _snapshot
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
