"""A rank that sends no results (tensor-parallel rank 1, an earlier pipeline stage) goes on to
launch while its steps run, but reads every step the engine has read before it launches the
next: its request states must hold the tokens the plan counts as known (a drafted request's
next input ids are read from them). Without this, rank 1 built a drafted request's inputs from
stale states now and then, its half of the step read other ids than rank 0's, and greedy
speculation at -tp 2 gave other tokens than without it (a race: ~2 runs in 3 at 16 prompts)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import msgspec
import pytest
import torch
import zmq

from ladle.distributed.pipeline import PipelineStage
from ladle.executor.multiprocess import ExecuteStep, SampleStep, StopWorker, _WorkerLoop
from ladle.protocol.step import ScheduledRequest, StepPlan, StepResult


class _Rank:
    """A worker that records launches and reads in order."""

    def __init__(self, sends_results: bool) -> None:
        self.events: list[str] = []
        self.stage = PipelineStage(index=0, size=1)
        self.sends_results = sends_results
        self.device = torch.device("cpu")

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


class _BusyGpu(_Rank):
    """A result-sending rank on a GPU (the device is only read for its type) whose step "a"
    runs until step "b" has been launched behind it, as a long decode step runs on while the
    engine's next plan crosses."""

    def __init__(self) -> None:
        super().__init__(sends_results=True)
        self.device = torch.device("cuda")
        self.b_launched = threading.Event()

    def execute(self, plan: StepPlan, masks=None):
        name = plan.scheduled[0].request_id
        self.events.append(f"launch {name}")
        if name == "b":
            self.b_launched.set()

        def result():
            if name == "a":
                self.b_launched.wait(1.0)  # a rank blocked here could never launch "b"
            self.events.append(f"read {name}")
            return StepResult(request_ids=[name], token_ids=[[1]])

        return SimpleNamespace(
            is_ready=lambda: name != "a" or self.b_launched.is_set(), result=result
        )


def test_a_gpu_rank_launches_the_next_plan_before_its_running_step_ends():
    """The plan for "b" comes 50 ms after "a" was launched (the engine was busy): the rank
    launches it while "a" still runs, and only then reads and sends "a"."""
    context = zmq.Context()
    inputs, feeder = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    outputs, collector = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    inputs.bind("inproc://gpu-plans")
    feeder.connect("inproc://gpu-plans")
    outputs.bind("inproc://gpu-results")
    collector.connect("inproc://gpu-results")
    rank = _BusyGpu()
    loop = _WorkerLoop(rank, inputs, outputs, parent_pid=None)
    thread = threading.Thread(target=loop.run, daemon=True)
    encoder = msgspec.msgpack.Encoder()
    try:
        thread.start()
        feeder.send(encoder.encode(ExecuteStep(_plan("a"))))
        threading.Event().wait(0.05)
        feeder.send(encoder.encode(ExecuteStep(_plan("b"))))
        assert collector.poll(3000) and collector.recv()
        assert collector.poll(3000) and collector.recv()
        feeder.send(encoder.encode(StopWorker()))
        thread.join(3)
    finally:
        for socket in (inputs, feeder, outputs, collector):
            socket.close(linger=0)
        context.term()
    assert rank.events == ["launch a", "launch b", "read a", "read b"]


def test_a_worker_process_freezes_its_start_up_objects_before_it_reports_ready(monkeypatch):
    """A worker serves one engine for life: once built, its objects leave the collector's
    scans (a full collection in one rank would stall every rank at its next collective)."""
    import gc

    from ladle.executor import multiprocess

    seen = {}

    class _Built(_Rank):
        def __init__(self, config, rank, rendezvous, device_index) -> None:
            super().__init__(sends_results=True)
            self.info = {"rank": rank}

    monkeypatch.setattr(multiprocess, "Worker", _Built)
    context = zmq.Context()
    feeder, ready, collector = (context.socket(kind) for kind in (zmq.PUSH, zmq.PULL, zmq.PULL))
    # The worker makes its own zmq context, which cannot reach this one's inproc endpoints.
    address = {
        name: f"tcp://127.0.0.1:{socket.bind_to_random_port('tcp://127.0.0.1')}"
        for name, socket in (("plans", feeder), ("ready", ready), ("results", collector))
    }
    saved = gc.get_threshold()
    gc.unfreeze()
    try:
        thread = threading.Thread(target=multiprocess.run_worker, kwargs=dict(
            config=None, rank=0, input_address=address["plans"],
            output_address=address["results"], ready_address=address["ready"],
            watch_parent=False,
        ), daemon=True)  # fmt: skip
        thread.start()
        assert ready.poll(5000)
        seen["ready"] = ready.recv_pyobj()
        seen["frozen"] = gc.get_freeze_count()
        feeder.send(msgspec.msgpack.Encoder().encode(StopWorker()))
        thread.join(5)
    finally:
        for socket in (feeder, ready, collector):
            socket.close(linger=0)
        context.term()
        gc.unfreeze()
        gc.set_threshold(*saved)
    assert seen["ready"] == ("ready", 0, {"rank": 0})
    assert seen["frozen"] > 0
