"""Where W3's time to first token goes (issue 8): host and device time of the first steps.

    python scripts/ttft_probe.py --workload W3 --out DIR

One request of the workload (512 prompt ids, greedy) through EngineCore.step, as the bench drives
it, several times after a warm-up run. For every step: host time of schedule, of the runner's
launch (input build, forward, sampler), of the model forward's launch alone, the device time of
the forward (CUDA events), and the wait for the sampled ids. Then the same first step under the
torch profiler (the ops' host time, the kernels' device time) and with the fused kernels off, and
the host cost of one launch of each Triton kernel against a plain torch op. Writes probe.json and
the profiler tables (probe_tables.txt) under --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ladle import LLM
from ladle.bench.workloads import build_requests, get_workload
from ladle.kernels.dispatch import set_fused_kernels


class Timers:
    """Wraps the engine's pieces with host timers; one record per engine step."""

    def __init__(self, engine) -> None:
        self.records: list[dict] = []
        self.current: dict = {}
        runner, scheduler = engine.executor.worker, engine.scheduler
        model = runner.model
        self._wrap(scheduler, "schedule", "schedule_ms")
        self._wrap(runner, "execute", "launch_ms")
        self._wrap(runner.input_builder, "build", "inputs_ms")
        self._wrap(runner.sampler, "__call__", "sampler_ms", instance_call=True)
        original_forward = model.forward
        timers = self

        on_cuda = runner.device.type == "cuda"

        def timed_forward(*args, **kwargs):
            if on_cuda:
                start_event = torch.cuda.Event(enable_timing=True)
                end_event = torch.cuda.Event(enable_timing=True)
                start_event.record()
            started = time.perf_counter()
            out = original_forward(*args, **kwargs)
            timers.current["forward_host_ms"] = (time.perf_counter() - started) * 1000
            if on_cuda:
                end_event.record()
                timers.current.setdefault("forward_events", []).append((start_event, end_event))
            return out

        model.forward = timed_forward

    def _wrap(self, owner, name, key, instance_call=False):
        timers = self
        if instance_call:
            cls = type(owner)
            original = cls.__call__

            class Timed(cls):
                def __call__(self, *args, **kwargs):
                    started = time.perf_counter()
                    try:
                        return original(self, *args, **kwargs)
                    finally:
                        timers.current[key] = (time.perf_counter() - started) * 1000

            owner.__class__ = Timed
            return
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timers.current[key] = (
                    timers.current.get(key, 0) + (time.perf_counter() - started) * 1000
                )

        setattr(owner, name, timed)

    def finish_step(self, step_ms: float, num_tokens: int) -> None:
        record = dict(self.current, step_ms=step_ms, new_tokens=num_tokens)
        self.current = {}
        self.records.append(record)

    def resolve(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        for record in self.records:
            events = record.pop("forward_events", [])
            if events:
                record["forward_gpu_ms"] = sum(s.elapsed_time(e) for s, e in events)


def one_request(engine, request, tag, timers: Timers | None) -> dict:
    started = time.perf_counter()
    engine.add_request(request.core_request(tag))
    ttft = None
    token_times = []
    steps_before_first = 0
    while engine.has_unfinished_requests():
        step_started = time.perf_counter()
        outputs = engine.step()
        now = time.perf_counter()
        count = sum(len(o.new_token_ids) for o in outputs)
        if timers is not None:
            timers.finish_step((now - step_started) * 1000, count)
        if count:
            if ttft is None:
                ttft = (now - started) * 1000
            token_times.append(now)
        elif ttft is None:
            steps_before_first += 1
    engine.kv_cache_manager.reset_prefix_cache()
    gaps = [(b - a) * 1000 for a, b in zip(token_times, token_times[1:])]
    return {
        "ttft_ms": ttft,
        "steps_before_first_token": steps_before_first,
        "itl_ms_p50": statistics.median(gaps) if gaps else None,
    }


def launch_costs(device) -> dict:
    """Host microseconds per launch (no sync in the loop) of each fused kernel and a torch op."""
    from ladle.kernels.activation import silu_and_mul
    from ladle.kernels.rms_norm import rms_norm

    x = torch.randn(512, 1024, device=device, dtype=torch.bfloat16)
    w = torch.ones(1024, device=device, dtype=torch.bfloat16)
    gate_up = torch.randn(512, 6144, device=device, dtype=torch.bfloat16)
    cases = {
        "torch_add": lambda: x + x,
        "torch_linear_512x1024x1024": lambda: torch.nn.functional.linear(x, x[:1024]),
        "triton_rms_norm": lambda: rms_norm(x, w, 1e-6),
        "triton_silu_and_mul": lambda: silu_and_mul(gate_up),
    }
    if hasattr(torch.nn.functional, "rms_norm"):
        cases["torch_F_rms_norm"] = lambda: torch.nn.functional.rms_norm(x, (1024,), w, 1e-6)
    result = {}
    for name, fn in cases.items():
        try:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(300):
                fn()
            host = (time.perf_counter() - started) / 300 * 1e6
            torch.cuda.synchronize()
            result[name] = round(host, 2)
        except Exception as error:  # a probe: report, go on
            result[name] = f"error: {error!r}"[:200]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="W3")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=".")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--model", default=None, help="default: the workload's (dummy weights)")
    parser.add_argument("--max-tokens", type=int, default=None, help="CPU smoke runs: fewer")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    workload = get_workload(args.workload)
    started = time.perf_counter()
    llm = LLM(
        args.model or workload.model_preset,
        load_format="dummy",
        async_scheduling=args.async_scheduling,
    )
    result: dict = {"startup_s": time.perf_counter() - started, "workload": args.workload}
    engine = llm.engine
    request = build_requests(workload)[0]
    if args.max_tokens:
        request = dataclasses.replace(request, max_tokens=args.max_tokens)
    on_cuda = engine.executor.worker.device.type == "cuda"
    one_request(engine, request, "warm", None)
    plain = [one_request(engine, request, f"plain-{i}", None) for i in range(args.repeats)]
    result["plain"] = plain
    timers = Timers(engine)
    timed = []
    for i in range(args.repeats):
        timers.records = []
        run = one_request(engine, request, f"timed-{i}", timers)
        timers.resolve()
        run["first_steps"] = timers.records[:4]
        run["decode_step_median"] = {
            key: statistics.median(r.get(key, 0) for r in timers.records[4:])
            for key in (
                "step_ms",
                "schedule_ms",
                "launch_ms",
                "inputs_ms",
                "sampler_ms",
                "forward_host_ms",
                "forward_gpu_ms",
            )
        }
        timed.append(run)
    result["timed"] = timed
    previous = set_fused_kernels(False)
    result["fused_off"] = [one_request(engine, request, f"unfused-{i}", None) for i in range(2)]
    set_fused_kernels(previous)
    if on_cuda:
        result["launch_us"] = launch_costs(engine.executor.worker.device)
    tables = []
    for label, steps in (("first two steps (TTFT)", 2), ("ten decode steps", 10)):
        engine.add_request(request.core_request(f"prof-{label}"))
        if steps == 10:
            for _ in range(6):
                engine.step()
        sync = torch.cuda.synchronize if on_cuda else (lambda: None)
        sync()
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
        with profile(activities=activities) as prof:
            for _ in range(steps):
                engine.step()
            sync()
        engine.abort_requests([f"prof-{label}"])
        while engine.has_unfinished_requests():
            engine.step()
        engine.kv_cache_manager.reset_prefix_cache()
        averages = prof.key_averages()
        tables.append(f"===== {label}: by host (self CPU) time")
        tables.append(
            averages.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60)
        )
        tables.append(f"===== {label}: by device time")
        tables.append(
            averages.table(sort_by="self_device_time_total", row_limit=20, max_name_column_width=60)
        )
        kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        result[f"profile_{steps}"] = {
            "num_kernels": len(kernels),
            "kernel_ms": sum(e.device_time for e in kernels) / 1000,
        }
        if steps == 2:
            prof.export_chrome_trace("/tmp/ttft_trace.json")
    with open(os.path.join(args.out, "probe_tables.txt"), "w") as handle:
        handle.write("\n".join(tables))
    with open(os.path.join(args.out, "probe.json"), "w") as handle:
        json.dump(result, handle, indent=1, default=str)
    print(json.dumps({k: v for k, v in result.items() if k != "timed"}, default=str)[:3000])
    for run in timed:
        print(json.dumps(run, default=str)[:2500])


if __name__ == "__main__":
    main()
