"""The engine-side inter-token time (`ladle:engine_inter_token_latency_seconds`) against gaps
worked out by hand, on a scripted stand-in engine driven by the real engine-core loop."""

from __future__ import annotations

import bisect
import os
from types import SimpleNamespace

import zmq

from ladle.engine import core_process
from ladle.engine.token_gap_meter import ENGINE_ITL_BOUNDS_S, TokenGapMeter
from ladle.frontend.metrics import ServerMetrics
from ladle.protocol import wire
from ladle.protocol.messages import EngineCoreOutput, SchedulerStats


def _out(request_id: str, num_tokens: int = 1, finish: str | None = None) -> EngineCoreOutput:
    return EngineCoreOutput(request_id, [7] * num_tokens, finish_reason=finish)


# Each step: (how long it takes, the outputs its frame carries). Times are chosen away from the
# histogram's bounds. By hand, per token of a stream that had one before (frame k leaves at
# 100 + the first k durations):
#   frame 1 (100.0100): a, b first tokens                                  -> no gaps
#   frame 2 (100.0168): a, b one each (0.0068, 0.0068); c first            -> 2 gaps
#   frame 3 (100.0363): a, c (0.0195 each); b sits out (preempted, say)    -> 2 gaps
#   frame 4 (100.0411): a two tokens, finished (0.0048 and 0); b (0.0243);
#                       c aborted, no token                                -> 3 gaps
#   frame 5 (100.0448): b's last (0.0037)                                  -> 1 gap
SCRIPT = [
    (0.0100, [_out("a"), _out("b")]),
    (0.0068, [_out("a"), _out("b"), _out("c")]),
    (0.0195, [_out("a"), _out("c")]),
    (0.0048, [_out("a", 2, "length"), _out("b"), EngineCoreOutput("c", [], finish_reason="abort")]),
    (0.0037, [_out("b", 1, "length")]),
]
HAND_GAPS = [0.0068, 0.0068, 0.0195, 0.0195, 0.0048, 0.0, 0.0243, 0.0037]


def _reference_counts(gaps: list[float]) -> list[int]:
    counts = [0] * (len(ENGINE_ITL_BOUNDS_S) + 1)
    for gap in gaps:
        counts[bisect.bisect_left(ENGINE_ITL_BOUNDS_S, gap)] += 1
    return counts


def test_meter_records_each_running_streams_wait_since_its_last_token():
    meter = TokenGapMeter()
    now = 100.0
    for seconds, outputs in SCRIPT:
        now += seconds
        meter.observe(outputs, now)
    assert meter.num_tokens == len(HAND_GAPS) == 8
    assert abs(meter.total_seconds - sum(HAND_GAPS)) < 1e-9
    assert meter.bucket_counts == _reference_counts(HAND_GAPS)
    assert meter.num_open_streams == 0  # finished and aborted streams are forgotten


def test_a_frame_of_aborts_alone_does_not_shorten_the_next_gap():
    meter = TokenGapMeter()
    meter.observe([_out("a"), _out("b")], 1.0)
    meter.observe([EngineCoreOutput("b", [], finish_reason="abort")], 1.004)
    meter.observe([_out("a")], 1.009)
    assert meter.num_tokens == 1 and abs(meter.total_seconds - 0.009) < 1e-12


class _ScriptedEngine:
    """EngineCore's interface as EngineCoreLoop uses it: each step advances a fake clock by its
    scripted duration and returns its scripted outputs; after the last it asks the loop to stop."""

    def __init__(self, clock: list[float], stop_address: str, context: zmq.Context) -> None:
        self.clock = clock
        self.steps = list(SCRIPT)
        self.stop = context.socket(zmq.PUSH)
        self.stop.connect(stop_address)

    def has_unfinished_requests(self) -> bool:
        return bool(self.steps)

    def step(self) -> list[EngineCoreOutput]:
        seconds, outputs = self.steps.pop(0)
        self.clock[0] += seconds
        if not self.steps:
            self.stop.send(wire.encode_input(wire.Shutdown()))
        return outputs

    def get_stats(self) -> SchedulerStats:
        return SchedulerStats()


def test_engine_loop_exports_the_gaps_in_metrics(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(core_process, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    context = zmq.Context()
    inputs = context.socket(zmq.PULL)
    inputs.bind("inproc://gap-meter-in")
    outputs = context.socket(zmq.PULL)
    outputs.bind("inproc://gap-meter-out")
    sender = context.socket(zmq.PUSH)
    sender.connect("inproc://gap-meter-out")
    engine = _ScriptedEngine(clock, "inproc://gap-meter-in", context)
    try:
        core_process.EngineCoreLoop(engine, inputs, sender, os.getppid()).run()
        frames = []
        while outputs.poll(100):
            frames.append(wire.decode_output(outputs.recv()))
    finally:
        for socket in (inputs, outputs, sender, engine.stop):
            socket.close(linger=0)
        context.term()
    assert [len(frame.outputs) for frame in frames] == [len(o) for _, o in SCRIPT]
    stats = frames[-1].stats
    assert list(stats.engine_itl_counts) == _reference_counts(HAND_GAPS)
    metrics = ServerMetrics("stand-in")
    metrics.record_engine_stats(stats)
    lines = {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in metrics.render().decode().splitlines()
        if line.startswith("ladle:engine_inter_token_latency_seconds")
    }
    name = "ladle:engine_inter_token_latency_seconds"
    label = 'model_name="stand-in"'
    assert lines[f"{name}_count{{{label}}}"] == 8
    assert abs(lines[f"{name}_sum{{{label}}}"] - sum(HAND_GAPS)) < 1e-9
    for bound, expected in (
        ("0.0005", 1),
        ("0.004", 2),
        ("0.005", 3),
        ("0.007", 5),
        ("0.02", 7),
        ("0.025", 8),
        ("+Inf", 8),
    ):
        assert lines[f'{name}_bucket{{le="{bound}",{label}}}'] == expected, bound
