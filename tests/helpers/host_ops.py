"""Counting the aten ops the host issues per engine step, by the ladle line that issued them.

On CUDA nearly every aten op the host dispatches outside a graph replay is one launch (a
kernel, a cudaMemcpyAsync or a memset) of a few us of host time, and with 128 requests
decoding on a small model those launches, not the kernels, decide how busy the GPU is. On the
CPU the same Python issues the same ops, so a TorchDispatchMode counts them without a GPU.

SiteOpCounter counts the non-view ops dispatched while `counting` is set, keyed by
(op name, first ladle frame outside the counter): "worker/step_inputs.py:171 build". Code the
GPU runs as a whole (the model forward, an emulated graph's replay) is left out by wrapping it
with `excluded` (its own ops are the graph's work on the GPU, not the host's).

PhaseTimer times named phases (thread CPU time, so other programs on the cores do not count);
a phase's nested phases are taken out of its own time.
"""

from __future__ import annotations

import collections
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# W3's model with one small layer and a small vocabulary: the host's work per step depends on
# neither, and the CPU's logits matmul and argmax over 151,936 ids would drown it.
TINY_LAYER = {
    "vocab_size": 4096,
    "num_hidden_layers": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}

_LADLE_ROOT = str(Path(__file__).resolve().parents[2] / "src" / "ladle") + "/"
_THIS_FILE = str(Path(__file__).resolve())


def _aliases_an_input(result, args) -> bool:
    """Whether a view-like op (aten.to is one: it may return its input) returned a view."""
    if not isinstance(result, torch.Tensor):
        return True
    storage = result.untyped_storage().data_ptr()
    return any(
        isinstance(arg, torch.Tensor) and arg.untyped_storage().data_ptr() == storage
        for arg in args
    )


def _issuing_site() -> str:
    """The first frame in src/ladle that is on the stack: 'worker/step_inputs.py:171 build'."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(_LADLE_ROOT):
            relative = filename[len(_LADLE_ROOT) :]
            return f"{relative}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return "(outside ladle)"


class SiteOpCounter(TorchDispatchMode):
    """Counts non-view aten ops dispatched while `counting` is set, by (op, issuing site)."""

    def __init__(self) -> None:
        super().__init__()
        self.counting = False
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if self.counting and (not func.is_view or not _aliases_an_input(result, args)):
            self.counts[(str(func.overloadpacket.__name__), _issuing_site())] += 1
        return result

    def total(self) -> int:
        return sum(self.counts.values())

    def by_op(self) -> collections.Counter[str]:
        totals: collections.Counter[str] = collections.Counter()
        for (op, _), count in self.counts.items():
            totals[op] += count
        return totals

    def excluded(self, owner: object, attribute: str) -> None:
        """Stop counting while owner.attribute runs (the GPU's own work: a forward, a replay)."""
        inner: Callable = getattr(owner, attribute)

        def uncounted(*args, **kwargs):
            if not self.counting:
                return inner(*args, **kwargs)
            self.counting = False
            try:
                return inner(*args, **kwargs)
            finally:
                self.counting = True

        setattr(owner, attribute, uncounted)


def step_halves(runner) -> tuple[str, str]:
    """The names of the runner's launch and sample halves that its execute calls, to time them
    (the undecorated ones; a tree before they were split off has only the decorated ones)."""
    if hasattr(runner, "_launch_forward"):
        return "_launch_forward", "_sample"
    return "launch_forward", "sample"


class PhaseTimer:
    """Host seconds per named phase while `recording`; nested phases leave their callers'."""

    def __init__(self) -> None:
        self.recording = False
        self.seconds: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._stack: list[float] = []  # time spent in nested phases, per open phase

    def wrap(self, owner: object, attribute: str, phase: str) -> None:
        inner: Callable = getattr(owner, attribute)

        def timed(*args, **kwargs):
            if not self.recording:
                return inner(*args, **kwargs)
            self._stack.append(0.0)
            started = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                elapsed = time.thread_time() - started
                nested = self._stack.pop()
                self.seconds[phase] += elapsed - nested
                if self._stack:
                    self._stack[-1] += elapsed

        setattr(owner, attribute, timed)


def decode_step_ops(
    llm, num_requests: int, prompt_len: int, num_steps: int
) -> tuple[SiteOpCounter, int]:
    """The ops of num_steps steady decode steps (every request past its prompt) of an LLM on
    the CPU, num_requests greedy requests of prompt_len tokens; the model forward and graph
    replays left out. Returns the counter (totals over the steps) and the steps counted."""
    from helpers.emulated_graphs import EmulatedGraph
    from ladle import SamplingParams

    engine = llm.engine
    runner = engine.executor.worker.runner
    counter = SiteOpCounter()
    counter.excluded(runner.model, "forward")
    counter.excluded(EmulatedGraph, "replay")
    params = SamplingParams(temperature=0.0, max_tokens=num_steps + 8, ignore_eos=True)
    vocab = engine.vocab_size
    for index in range(num_requests):
        prompt = [(7 * index + 3 * i) % (vocab - 10) + 5 for i in range(prompt_len)]
        llm._submit(f"ops-{index}", None, prompt, params, time.monotonic(), 0)
    scheduler = engine.scheduler
    measured = 0
    with counter:
        while engine.has_unfinished_requests() and measured < num_steps:
            steady = not scheduler.waiting and all(
                r.num_computed_tokens >= r.num_prompt_tokens for r in scheduler.running
            )
            counter.counting = steady
            llm.output_processor.process_outputs(engine.step())
            measured += steady
        counter.counting = False
    engine.abort_requests([f"ops-{index}" for index in range(num_requests)])
    while engine.has_unfinished_requests():
        llm.output_processor.process_outputs(engine.step())
    return counter, measured
