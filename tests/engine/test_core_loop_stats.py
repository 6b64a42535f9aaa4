"""Which frames of the engine-core loop carry fresh stats: a busy engine's at most every
BUSY_STATS_INTERVAL_S, and at once after an input, a request's end, or the step that left the
engine idle (issue 33: gathering and encoding them every batch-1 step cost the host ~5% of it).
A scripted stand-in engine, a fake clock, the real loop and ZMQ wire."""

from __future__ import annotations

import os
from types import SimpleNamespace

import zmq

from ladle.engine import core_process
from ladle.protocol import wire
from ladle.protocol.messages import EngineCoreOutput, SchedulerStats

STEP_S = 0.001
NUM_STEPS = 40
FINISHES_AT = 17  # the step whose output ends a request ("b")


class _CountingEngine:
    """Each step advances the clock by STEP_S and gives "a" one token (and "b" its last at step
    FINISHES_AT); get_stats reports the steps taken so far, so a frame's stats show how fresh
    they are. After the last step it asks the loop to stop."""

    def __init__(self, clock: list[float], stop_address: str, context: zmq.Context) -> None:
        self.clock = clock
        self.num_steps = 0
        self.stop = context.socket(zmq.PUSH)
        self.stop.connect(stop_address)

    def has_unfinished_requests(self) -> bool:
        return self.num_steps < NUM_STEPS

    def step(self) -> list[EngineCoreOutput]:
        self.clock[0] += STEP_S
        self.num_steps += 1
        outputs = [EngineCoreOutput("a", [7])]
        if self.num_steps == FINISHES_AT:
            outputs.append(EngineCoreOutput("b", [7], finish_reason="length"))
        if self.num_steps == NUM_STEPS:
            self.stop.send(wire.encode_input(wire.Shutdown()))
        return outputs

    def expire_handoffs(self) -> None:
        pass

    def get_stats(self) -> SchedulerStats:
        return SchedulerStats(num_decode_tokens=self.num_steps)


def test_busy_stats_come_every_interval_and_at_once_on_an_end_or_going_idle(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(core_process, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    context = zmq.Context()
    inputs = context.socket(zmq.PULL)
    inputs.bind("inproc://core-loop-stats-in")
    outputs = context.socket(zmq.PULL)
    outputs.bind("inproc://core-loop-stats-out")
    sender = context.socket(zmq.PUSH)
    sender.connect("inproc://core-loop-stats-out")
    engine = _CountingEngine(clock, "inproc://core-loop-stats-in", context)
    try:
        core_process.EngineCoreLoop(engine, inputs, sender, os.getppid()).run()
        frames = []
        while outputs.poll(100):
            frames.append(wire.decode_output(outputs.recv()))
    finally:
        for socket in (inputs, outputs, sender, engine.stop):
            socket.close(linger=0)
        context.term()
    assert len(frames) == NUM_STEPS  # every step's tokens still go out at once
    with_stats = [
        index + 1 for index, frame in enumerate(frames) if frame.stats is not None
    ]
    # Every stats frame is fresh: taken after the step whose frame carries it.
    for step in with_stats:
        assert frames[step - 1].stats.num_decode_tokens == step
    interval_steps = round(core_process.BUSY_STATS_INTERVAL_S / STEP_S)
    assert FINISHES_AT in with_stats and NUM_STEPS in with_stats
    assert len(with_stats) <= NUM_STEPS // interval_steps + 3
    # Never more than the interval without them while busy.
    gaps = [b - a for a, b in zip([0, *with_stats], with_stats)]
    assert max(gaps) <= interval_steps
