"""The host's work per decode step at batch 1, measured on the CPU (issue 8, W3).

    python scripts/host_step_profile.py [--steps 200] [--no-async-scheduling] [--eager]
        [--no-phases] [--temperature T] [--logprobs K] [--speculative-config '{"method": "ngram", "num_speculative_tokens": 4,
                                "adaptive": false, "synthetic_acceptance": 0.6}']

W3 on the H100 is host-bound: the GPU waits for the Python that schedules, builds the inputs,
launches the graph and the sampler and reads the sampled id. This runs that same step loop
(LLM._drive's engine.step + output processing) on the CPU, over W3's model shape shrunk to one
tiny layer and a 4,096-id vocabulary, so the model's own compute is small (and timed apart),
and reports:

- per-phase host time per decode step: the thread's CPU time (time.thread_time, torch on one
  thread), so other programs sharing the cores do not count; the model forward, which is the
  GPU's work there, is timed apart and left out of its callers' time;
- the aten ops a decode step dispatches outside the model forward (a TorchDispatchMode with
  the forward excluded), by name: on CUDA nearly each is one kernel launch (a copy, a gather)
  at ~9 us of host time each, except views, which this count leaves out.

--temperature 0.6 --logprobs 0 gives the request S1's served sampling options (`ladle bench
serve --token-ids` asks for the sampled token's logprob) instead of W3's greedy ones. On the CPU
a random row draws through the torch path (sample/rng.py: ~70 ops a step) where CUDA runs one
fused kernel pair, so only the logprob path's ops compare with the GPU's.

By default the decode graph path is emulated: the runner gets a DecodeGraphs whose "graphs"
run the model eagerly on the graphs' static buffers, so the step takes the graph path's code
(the static-buffer copies, the padding) as on the GPU. --eager takes the eager path instead.
CPU numbers: compare them with each other (before/after a change), not with the H100's.

With --speculative-config, n-gram drafts are made on the host on the CPU (drafted steps then
wait for their result) unless the config says "drafts_on_device": true, which is the GPU's
default path (spec_decode/placement.py): add it to measure what a served GPU's drafted step
does on the host. The CPU still takes the torch path of kernels/draft_steps.py's three
launches (~60 ops a drafted step that are three launches on the GPU), and its verify step runs
the model eagerly, not through the prefill graphs (step_host_ops.py emulates those).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import hashlib
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

from ladle import LLM, SamplingParams
from ladle.worker.model_runner import LaunchedStep

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.emulated_graphs import EmulatedGraph, install_emulated_graphs  # noqa: E402
from helpers.host_ops import TINY_LAYER, PhaseTimer, SiteOpCounter, step_halves  # noqa: E402

FORWARD_PHASE = "model forward (device work on the GPU)"
LOGITS_PHASE = "logits matmul (device work on the GPU)"
WARM_UP_STEPS = 8


def _generate(llm, timer: PhaseTimer, counter: SiteOpCounter, args, count_ops: bool):
    """One W3-like request through LLM._drive's loop; times (or counts the ops of) the decode
    steps after WARM_UP_STEPS. Returns the step times, the tokens and the cProfile, if any."""
    engine = llm.engine
    params = SamplingParams(
        temperature=args.temperature,
        max_tokens=args.steps + WARM_UP_STEPS + 4,
        logprobs=args.logprobs,
        seed=0,
        ignore_eos=True,
    )
    prompt = [(7 * i + 3) % 4000 + 10 for i in range(args.prompt_len)]
    llm._submit(f"profile-{count_ops}", None, prompt, params, time.monotonic(), 0)
    step_times: list[float] = []
    tokens: list[int] = []
    num_steps = 0
    profiler = cProfile.Profile() if args.cprofile and not count_ops else None
    with counter if count_ops else contextlib.nullcontext():
        while engine.has_unfinished_requests():
            measured = WARM_UP_STEPS <= num_steps < WARM_UP_STEPS + args.steps
            timer.recording = measured and not count_ops
            counter.counting = measured and count_ops
            if profiler is not None:
                (profiler.enable if measured else profiler.disable)()
            started = time.thread_time()
            outputs = engine.step()
            request_outputs, _ = llm.output_processor.process_outputs(outputs)
            if measured:
                step_times.append(time.thread_time() - started)
            for output in request_outputs:
                if output.finished:
                    tokens = output.outputs[0].token_ids
            num_steps += 1
    timer.recording = counter.counting = False
    if profiler is not None:
        profiler.disable()
    _generate.tokens_per_step = len(tokens) / max(num_steps, 1)
    return step_times, tokens, profiler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200, help="decode steps measured")
    parser.add_argument("--prompt-len", type=int, default=512)
    # W3 is greedy without logprobs; S1 through `ladle bench serve --token-ids` samples at 0.6
    # and asks for the sampled token's logprob (--temperature 0.6 --logprobs 0).
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--logprobs", type=int, default=None)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--eager", action="store_true", help="the eager path, no emulated graphs")
    parser.add_argument("--cprofile", type=int, default=0, help="also print the N costliest calls")
    parser.add_argument(
        "--phases",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time each phase (--no-phases: only the model's, which the host figure leaves "
        "out; the phase timer's own ~2 us a phase and call are then not in the step)",
    )
    parser.add_argument(
        "--speculative-config", type=json.loads, default=None,
        help="JSON, as `ladle serve`'s; with synthetic_acceptance the drafts are accepted by "
        "coin (the host's work per verify step, issue 33)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    llm = LLM(
        "qwen3-0.6b",
        load_format="dummy",
        device="cpu",
        hf_overrides=TINY_LAYER,
        async_scheduling=args.async_scheduling,
        cpu_kv_cache_gib=0.25,
        speculative_config=args.speculative_config,
    )
    engine, worker = llm.engine, llm.engine.executor.worker
    runner = worker.runner
    if not args.eager:
        install_emulated_graphs(worker)
    counter = SiteOpCounter()
    timer = PhaseTimer()
    if args.phases:
        timer.wrap(engine.scheduler, "schedule", "schedule")
        timer.wrap(runner.input_builder, "build", "build inputs")
        timer.wrap(runner, step_halves(runner)[0], "launch forward (rest: ids, copies, logits)")
    timer.wrap(runner.model, "forward", FORWARD_PHASE)
    timer.wrap(EmulatedGraph, "replay", FORWARD_PHASE)
    counter.excluded(runner.model, "forward")  # the GPU's own work there
    counter.excluded(EmulatedGraph, "replay")
    # Its ops count (they are launches on the GPU too); its time is the GPU's there.
    timer.wrap(runner.model, "compute_logits", LOGITS_PHASE)
    if args.phases:
        timer.wrap(runner, step_halves(runner)[1], "sample (metadata, sampler, id copy)")
        timer.wrap(LaunchedStep, "result", "read sampled ids")
        timer.wrap(engine.scheduler, "update_from_output", "update from output")
        timer.wrap(llm.output_processor, "process_outputs", "output processing")
        timer.wrap(engine, "step", "engine step (rest)")

    # Pass 1 times the steps; pass 2 counts their ops (the dispatch mode slows every op down).
    step_times, tokens, profiler = _generate(llm, timer, counter, args, count_ops=False)
    _generate(llm, timer, counter, args, count_ops=True)
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(args.cprofile)
    per_step_us = {
        phase: round(seconds / len(step_times) * 1e6, 1) for phase, seconds in timer.seconds.items()
    }
    model_us = per_step_us.get(FORWARD_PHASE, 0.0) + per_step_us.get(LOGITS_PHASE, 0.0)
    ops = {name: count / len(step_times) for name, count in counter.by_op().most_common()}
    print(
        json.dumps(
            {
                "path": "eager" if args.eager else "emulated graphs",
                "speculative_config": args.speculative_config,
                "temperature": args.temperature,
                "logprobs": args.logprobs,
                "async_scheduling": args.async_scheduling,
                "steps": len(step_times),
                "step_us_median": round(statistics.median(step_times) * 1e6, 1),
                "host_us_per_step_without_forward": round(
                    statistics.mean(step_times) * 1e6 - model_us, 1
                ),
                "phase_us_per_step": per_step_us,
                "ops_per_step_outside_forward": round(sum(ops.values()), 2),
                "ops_by_name": {name: round(count, 2) for name, count in ops.items()},
                "tokens_sha1": hashlib.sha1(repr(tokens).encode()).hexdigest()[:12],
                "num_tokens": len(tokens),
                # With drafts a step emits several tokens (and waits for its result).
                "tokens_per_step": round(_generate.tokens_per_step, 2),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
