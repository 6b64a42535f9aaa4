"""The GPU's idle time between engine steps, from the torch profiler (issue 8, overlap).

    python scripts/step_gap.py --workload W1 --num-requests 256 [--no-async-scheduling]
        [--speculative-config JSON] [--top-kernels N]

Runs the workload's requests to their steady decode phase (every prompt in), then profiles
--steps engine steps: wall time, the union of the CUDA kernels' intervals (busy), and the idle
time per step (wall - busy, over the steps) with the median and largest single gap between two
kernels, and the kernel count per step. --top-kernels N adds the N kernels of most GPU time
(us per step, launches per step). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ladle import LLM
from ladle.bench.gpu_timing import busy_and_gaps
from ladle.bench.workloads import build_requests, get_workload


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="W1")
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument(
        "--speculative-config", default=None, help="speculation as JSON (vLLM's spelling)"
    )
    parser.add_argument("--top-kernels", type=int, default=0)
    args = parser.parse_args()
    workload = get_workload(args.workload)
    llm = LLM(
        workload.model_preset,
        load_format="dummy",
        async_scheduling=args.async_scheduling,
        enforce_eager=args.enforce_eager,
        speculative_config=json.loads(args.speculative_config)
        if args.speculative_config
        else None,
    )
    engine = llm.engine
    requests = build_requests(workload)[: args.num_requests]
    for index, request in enumerate(requests):
        # No request ends while profiled.
        engine.add_request(
            request.core_request(f"gap-{index}", max_tokens=max(request.max_tokens, 1000))
        )
    while len(engine.scheduler.waiting) or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    for _ in range(5):
        engine.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        started = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - started
    kernel_events = [
        event for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA
    ]
    kernels = sorted((event.time_range.start, event.time_range.end) for event in kernel_events)
    by_name: dict[str, list[float]] = {}
    for event in kernel_events:
        by_name.setdefault(event.name, []).append(event.time_range.end - event.time_range.start)
    top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[: args.top_kernels]
    busy_us, gaps = busy_and_gaps(kernels)
    span_us = kernels[-1][1] - kernels[0][0]
    print(
        json.dumps(
            {
                "workload": args.workload,
                "num_requests": len(requests),
                "async_scheduling": args.async_scheduling,
                "enforce_eager": args.enforce_eager,
                "steps": args.steps,
                "wall_ms_per_step": wall * 1000 / args.steps,
                "kernel_busy_ms_per_step": busy_us / 1000 / args.steps,
                "idle_ms_per_step": (span_us - busy_us) / 1000 / args.steps,
                "busy_fraction_of_kernel_span": busy_us / span_us,
                "median_gap_us": statistics.median(gaps) if gaps else 0.0,
                "largest_gap_us": max(gaps, default=0.0),
                "kernels_per_step": len(kernels) / args.steps,
                "top_kernels_us_and_launches_per_step": [
                    [name[:80], round(sum(times) / args.steps, 1), len(times) / args.steps]
                    for name, times in top
                ],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
