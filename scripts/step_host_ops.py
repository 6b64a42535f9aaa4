"""The host's per-step work while 128 short requests decode: aten ops by issuing line, host us
by phase (issue 38: the GPU was busy 73.4% of W1's decode, 482 copies in 96 steps).

    python scripts/step_host_ops.py [--requests 128] [--steps 32] [--prompt-len 32]
        [--device cpu|cuda] [--eager] [--speculative-config JSON] [--python-profile N]
        [--temperature T] [--logprobs K] [--json PATH]

Runs the engine (LLM's loop: engine.step, then output processing) on --requests greedy requests
of --prompt-len tokens, and over --steps steady decode steps (every request past its prompt):

- pass 1 times each phase per step (thread CPU time; a phase's nested phases leave its time):
  schedule, build inputs, launch forward (the rest: device ids, graph inputs, logits), sample,
  read the sampled ids, update from output, output processing; the model forward and graph
  replays are the GPU's work and are timed apart;
- pass 2 counts the aten ops the host dispatches outside the model forward and outside graph
  replays (a TorchDispatchMode), by op and by the first src/ladle line on the stack. On CUDA
  each is about one launch: a kernel, a cudaMemcpyAsync or a memset. Triton kernels launched
  outside graph captures are counted beside them, by kernel (the dispatch mode does not see
  them, and each costs the host more than an aten op);
- with --python-profile N, pass 3 runs the measured steps under cProfile and prints the N
  functions of most own time (ladle's, torch's and Triton's launch code), per step.

On the CPU (the default) the model is W1's 0.6B shape shrunk to one small layer and a 4,096-id
vocabulary, so the forward is small; the decode and prefill graph paths are emulated
(tests/helpers), so a step takes the graph path's code as on the GPU (a drafted step's verify
replays a prefill graph). Two launches of the GPU step do not show as ops on the CPU: the pinned
host-to-device copy of the step's inputs and the device-to-host copy of the sampled ids (one
each per step). --device cuda runs the same on the GPU with real graphs
(the op counts are then the GPU's launches; the phase times include the launches' host cost).
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch

from ladle import LLM, SamplingParams
from ladle.worker.model_runner import LaunchedStep

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.emulated_graphs import (  # noqa: E402
    EmulatedGraph,
    EmulatedPrefillGraph,
    install_emulated_graphs,
)
from helpers.host_ops import TINY_LAYER, PhaseTimer, SiteOpCounter, step_halves  # noqa: E402

FORWARD_PHASE = "model forward / graph replay (GPU work)"
WARM_UP_STEPS = 4


def _build_llm(args) -> LLM:
    # Overlapped scheduling, as on CUDA by default (the CPU default is off).
    options = dict(
        load_format="dummy",
        device=args.device,
        max_num_seqs=max(256, args.requests),
        async_scheduling=True,
    )
    if args.device == "cpu":
        options.update(hf_overrides=TINY_LAYER, cpu_kv_cache_gib=0.5)
    if args.eager:
        options["enforce_eager"] = True
    if args.kv_offloading_size:
        options["kv_offloading_size"] = args.kv_offloading_size
    if args.speculative_config:
        options["speculative_config"] = json.loads(args.speculative_config)
    llm = LLM("qwen3-0.6b", **options)
    if args.device == "cpu" and not args.eager:
        # Prefill graphs too: a drafted step's verify replays one on the GPU.
        install_emulated_graphs(llm.engine.executor.worker, prefill=True)
    return llm


def _steady(scheduler) -> bool:
    return not scheduler.waiting and all(
        r.num_computed_tokens >= r.num_prompt_tokens for r in scheduler.running
    )


def _run(llm: LLM, args, tag: str, on_step) -> list[float]:
    """The requests through LLM's loop; on_step(True/False) before each step says whether it
    is measured. Returns each measured step's host seconds (thread time)."""
    engine = llm.engine
    params = SamplingParams(
        temperature=args.temperature, max_tokens=args.steps + WARM_UP_STEPS + 8, ignore_eos=True,
        logprobs=args.logprobs,
    )
    vocab = engine.vocab_size
    for index in range(args.requests):
        prompt = [(7 * index + 3 * i) % (vocab - 10) + 5 for i in range(args.prompt_len)]
        llm._submit(f"{tag}-{index}", None, prompt, params, time.monotonic(), 0)
    steady_steps = 0
    step_seconds = []
    while engine.has_unfinished_requests():
        steady = _steady(engine.scheduler)
        measured = steady and WARM_UP_STEPS <= steady_steps < WARM_UP_STEPS + args.steps
        steady_steps += steady
        on_step(measured)
        started = time.thread_time()
        llm.output_processor.process_outputs(engine.step())
        if measured:
            step_seconds.append(time.thread_time() - started)
    on_step(False)
    return step_seconds


def _time_phases(llm: LLM, args) -> dict:
    engine = llm.engine
    runner = engine.executor.worker.runner
    timer = PhaseTimer()
    timer.wrap(engine.scheduler, "schedule", "schedule")
    timer.wrap(runner.input_builder, "build", "build inputs")
    timer.wrap(runner, step_halves(runner)[0], "launch forward (rest: device ids, graph inputs)")
    timer.wrap(runner.model, "forward", FORWARD_PHASE)
    timer.wrap(EmulatedGraph, "replay", FORWARD_PHASE)
    timer.wrap(EmulatedPrefillGraph, "replay", FORWARD_PHASE)
    timer.wrap(runner.model, "compute_logits", "logits (GPU work)")
    timer.wrap(runner, step_halves(runner)[1], "sample (metadata, sampler, id copy)")
    timer.wrap(LaunchedStep, "result", "read sampled ids")
    timer.wrap(engine.scheduler, "update_from_output", "update from output")
    timer.wrap(llm.output_processor, "process_outputs", "output processing")
    timer.wrap(engine, "step", "engine step (rest)")

    def on_step(measured: bool) -> None:
        timer.recording = measured

    step_seconds = _run(llm, args, "time", on_step)
    num_steps = max(len(step_seconds), 1)
    phases = {name: seconds / num_steps * 1e6 for name, seconds in timer.seconds.items()}
    gpu_us = sum(us for name, us in phases.items() if "GPU work" in name)
    return {
        "steps_timed": len(step_seconds),
        "host_us_per_step": sum(step_seconds) / num_steps * 1e6 - gpu_us,
        "phase_us_per_step": dict(sorted(phases.items(), key=lambda item: -item[1])),
    }


def _count_ops(llm: LLM, args) -> dict:
    runner = llm.engine.executor.worker.runner
    counter = SiteOpCounter()
    counter.excluded(runner.model, "forward")
    counter.excluded(EmulatedGraph, "replay")
    counter.excluded(EmulatedPrefillGraph, "replay")
    counted = [0]

    def on_step(measured: bool) -> None:
        counter.counting = measured
        counted[0] += measured

    triton_launches: collections.Counter[str] = collections.Counter()
    with counter, _counting_triton_launches(triton_launches, counter):
        _run(llm, args, "count", on_step)
    num_steps = max(counted[0], 1)
    by_site: dict[str, dict[str, float]] = {}
    for (op, site), count in sorted(counter.counts.items(), key=lambda item: -item[1]):
        by_site.setdefault(site, {})[op] = count / num_steps
    return {
        "steps_counted": counted[0],
        "ops_per_step": counter.total() / num_steps,
        "ops_by_name": {op: count / num_steps for op, count in counter.by_op().most_common()},
        "ops_by_site": by_site,
        "triton_launches_per_step": {
            name: count / num_steps for name, count in triton_launches.most_common()
        },
    }


class _counting_triton_launches:
    """Counts Triton kernel launches by kernel name while counter.counting (and no graph is
    being captured: a captured launch costs nothing at replay): those through Triton's launch
    path (JITFunction.run) and those kernels/launch.py sends to the compiled kernel directly."""

    def __init__(self, launches: collections.Counter, counter: SiteOpCounter) -> None:
        self.launches, self.counter = launches, counter
        self.restore = []

    def _counts(self) -> bool:
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        return self.counter.counting and not capturing

    def __enter__(self):
        try:
            from triton.runtime.jit import JITFunction
        except ImportError:
            return self
        from ladle.kernels.launch import _KernelLaunches

        launches = self.launches
        through_triton, direct = JITFunction.run, _KernelLaunches.bound_values

        def run(fn, *args, **kwargs):
            if not kwargs.get("warmup") and self._counts():
                launches[getattr(fn, "__name__", repr(fn))] += 1
            return through_triton(fn, *args, **kwargs)

        def bound_values(kernel_launches, *args, **kwargs):  # only the direct path calls it
            if self._counts():
                launches[kernel_launches.kernel.__name__] += 1
            return direct(kernel_launches, *args, **kwargs)

        JITFunction.run, _KernelLaunches.bound_values = run, bound_values
        self.restore = [
            (JITFunction, "run", through_triton),
            (_KernelLaunches, "bound_values", direct),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for owner, name, original in self.restore:
            setattr(owner, name, original)


def _profile_python(llm: LLM, args) -> str:
    """The measured steps under cProfile: the functions of most own time, us per step."""
    profiler = cProfile.Profile(time.thread_time)
    counted = [0]

    def on_step(measured: bool) -> None:
        if measured and not counted[1:]:
            counted.append(True)
            profiler.enable()
        elif not measured and counted[1:]:
            profiler.disable()
            counted.pop()
        counted[0] += measured

    _run(llm, args, "profile", on_step)
    profiler.disable()
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    num_steps = max(counted[0], 1)
    rows = []
    for (path, line, name), (calls, _, own, cumulative, _) in stats.stats.items():
        rows.append((own, cumulative, calls, f"{_short_path(path)}:{line} {name}"))
    rows.sort(reverse=True)
    lines = [f"python profile, {num_steps} steps: own us / cumulative us / calls, per step"]
    for own, cumulative, calls, where in rows[: args.python_profile]:
        lines.append(
            f"  {own / num_steps * 1e6:8.1f} {cumulative / num_steps * 1e6:9.1f} "
            f"{calls / num_steps:6.2f}  {where}"
        )
    return "\n".join(lines)


def _short_path(path: str) -> str:
    for marker in ("/ladle/", "/torch/", "/triton/"):
        if marker in path:
            return marker.strip("/") + "/" + path.split(marker, 1)[1]
    return path.rsplit("/", 1)[-1]


def _print_table(result: dict) -> None:
    print(f"device {result['device']}, {result['requests']} requests, path {result['path']}")
    print(f"host us per step (GPU work left out): {result['host_us_per_step']:.0f}")
    for phase, us in result["phase_us_per_step"].items():
        print(f"  {us:9.1f} us  {phase}")
    print(f"aten ops per step outside the forward: {result['ops_per_step']:.2f}")
    for op, count in result["ops_by_name"].items():
        print(f"  {count:7.2f}  {op}")
    print("by issuing line:")
    for site, ops in result["ops_by_site"].items():
        described = ", ".join(f"{op} {count:.2f}" for op, count in ops.items())
        print(f"  {site}: {described}")
    launches = result["triton_launches_per_step"]
    print(f"Triton launches per step outside graphs: {sum(launches.values()):.2f}")
    for name, count in launches.items():
        print(f"  {count:7.2f}  {name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32, help="steady decode steps measured")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=0.0)
    # S1 through `ladle bench serve --token-ids` asks for the sampled token's logprob: 0.
    parser.add_argument("--logprobs", type=int, default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--eager", action="store_true", help="no (emulated) graphs")
    parser.add_argument(
        "--kv-offloading-size",
        type=float,
        default=0.0,
        help="GiB of KV host tier (0: off); with it on, every block that fills is stored",
    )
    parser.add_argument(
        "--speculative-config",
        default=None,
        help='speculation as JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4, '
        '"drafts_on_device": true}\' (its steps count as any others: drafted or not)',
    )
    parser.add_argument(
        "--python-profile",
        type=int,
        default=0,
        metavar="N",
        help="also profile the measured steps with cProfile and print the N costliest functions",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(1)
    llm = _build_llm(args)
    result = {
        "device": args.device,
        "requests": args.requests,
        "temperature": args.temperature,
        "logprobs": args.logprobs,
        "path": "eager" if args.eager else "graphs",
    }
    # Timing first: the dispatch mode of the count slows every op down.
    result.update(_time_phases(llm, args))
    result.update(_count_ops(llm, args))
    _print_table(result)
    if args.python_profile:
        print(_profile_python(llm, args))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
