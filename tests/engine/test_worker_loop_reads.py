"""A rank that sends no results (tensor-parallel rank 1, an earlier pipeline stage) goes on to
launch while its steps run, but reads every step the engine has read before it launches the
next: its request states must hold the tokens the plan counts as known (a drafted request's
next input ids are read from them). Without this, rank 1 built a drafted request's inputs from
stale states now and then, its half of the step read other ids than rank 0's, and greedy
speculation at -tp 2 gave other tokens than without it (a race: ~2 runs in 3 at 16 prompts)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ladle.distributed.pipeline import PipelineStage
from ladle.executor.multiprocess import ExecuteStep, SampleStep, _WorkerLoop
from ladle.protocol.step import ScheduledRequest, StepPlan


class _Rank:
    """A worker that records launches and reads in order."""

    def __init__(self, sends_results: bool) -> None:
        self.events: list[str] = []
        self.stage = PipelineStage(index=0, size=1)
        self.sends_results = sends_results

    def execute(self, plan: StepPlan, masks=None):
        self.events.append(f"launch {plan.scheduled[0].request_id}")
        return self._launched(plan)

    def _launched(self, plan: StepPlan):
        name = plan.scheduled[0].request_id

        def result():
            self.events.append(f"read {name}")
            return SimpleNamespace(failed=None)

        return SimpleNamespace(is_ready=lambda: True, result=result)

    def launch_forward(self, plan: StepPlan):
        self.events.append(f"forward {plan.scheduled[0].request_id}")
        return plan

    def sample(self, plan: StepPlan, masks=None):
        self.events.append(f"sample {plan.scheduled[0].request_id}")
        return self._launched(plan)


def _plan(name: str) -> StepPlan:
    return StepPlan(scheduled=[ScheduledRequest(name, 1, 3, 0)])


@pytest.mark.parametrize("num_results_read", [0, 1, 2])
def test_a_rank_reads_the_steps_the_engine_read_before_it_launches(num_results_read):
    rank = _Rank(sends_results=False)
    loop = _WorkerLoop(rank, inputs=None, outputs=None, parent_pid=None)
    loop._execute(ExecuteStep(_plan("a")))
    loop._execute(ExecuteStep(_plan("b"), num_results_read=0))  # launched while "a" ran
    loop._execute(ExecuteStep(_plan("c"), num_results_read=num_results_read))
    expected_reads = [f"read {name}" for name in "ab"[:num_results_read]]
    assert rank.events == ["launch a", "launch b", *expected_reads, "launch c"]
    assert len(loop.in_flight) == 3 - num_results_read
    assert loop.num_finished == num_results_read


def test_a_split_step_samples_after_the_step_the_engine_read_in_between():
    """A grammar or bad_words step is launched, the engine reads the step before, then the
    step samples (from that step's tokens): every rank reads it before sampling."""
    rank = _Rank(sends_results=False)
    loop = _WorkerLoop(rank, inputs=None, outputs=None, parent_pid=None)
    loop._execute(ExecuteStep(_plan("a")))
    loop._execute(ExecuteStep(_plan("b"), split=True, num_results_read=0))
    loop._sample(SampleStep(num_results_read=1))
    assert rank.events == ["launch a", "forward b", "read a", "sample b"]
