"""A torch-profiler window over a worker's steps, switched on from the environment (vLLM's
VLLM_TORCH_PROFILER_DIR does the same): where a rank's GPU time goes and how long it idles
between kernels, in every rank's own process, which a profiler around the engine cannot see.

    LADLE_TORCH_PROFILER_DIR=/tmp/prof LADLE_PROFILE_STEPS=100:50 ladle bench latency ... -tp 2

skips the first 100 steps of each rank, profiles the next 50 and writes, per rank,
`rank{R}.json` (wall and kernel-busy ms per step, idle gaps, the kernels by GPU time) and
`rank{R}.trace.json` (a Chrome trace). The window ends with a device synchronisation, so the
steps after it are not timed by anything here.

LADLE_PROFILE_PYTHON=1 runs cProfile over the window instead, in the thread that launches the
steps (the engine core's, for one GPU): `rank{R}.pstats` and `rank{R}.python.txt` (functions by
own time a step). It answers what the torch profile cannot: which Python code holds a step's host
time, e.g. in `ladle serve`'s engine process, where no script's profiler reaches. Never both in
one window: under the torch profiler a CUDA graph's replay held the host ~10x longer (its CUPTI
hooks record every node: 364 us a batch-1 decode replay on an H200, against 35 us without).
cProfile itself slows the host's Python about twofold; compare its figures with each other.
"""

from __future__ import annotations

import collections
import cProfile
import json
import os
import pstats
import re
import sys
import time
from pathlib import Path

import torch

from ladle.bench.gpu_timing import busy_and_gaps

DIRECTORY_ENV = "LADLE_TORCH_PROFILER_DIR"
WINDOW_ENV = "LADLE_PROFILE_STEPS"
PYTHON_ENV = "LADLE_PROFILE_PYTHON"
TOP_FUNCTIONS = 40
DEFAULT_WINDOW = (100, 50)
TOP_KERNELS = 25
# What a collective is called in a profile: NCCL's and the one-shot all-reduce's kernels on CUDA,
# the c10d ops (gloo runs them on the host) on the CPU.
COLLECTIVE = re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|^c10d::",
                        re.IGNORECASE)


class StepProfiler:
    """Counts a rank's steps; profiles steps [skip, skip + count) and writes the summary."""

    def __init__(self, directory: Path, rank: int, device: torch.device, skip: int, count: int,
                 python: bool = False):  # fmt: skip
        self.directory, self.rank, self.device = directory, rank, device
        self.skip, self.count = skip, count
        self.python = python
        self.steps = 0
        self._profile = None
        self._python_profile: cProfile.Profile | None = None
        self._started = 0.0

    @classmethod
    def from_env(cls, rank: int, device: torch.device) -> StepProfiler | None:
        directory = os.environ.get(DIRECTORY_ENV)
        if not directory:
            return None
        skip, count = DEFAULT_WINDOW
        window = os.environ.get(WINDOW_ENV)
        if window:
            try:
                skip, count = (int(part) for part in window.split(":"))
            except ValueError:
                raise ValueError(
                    f"{WINDOW_ENV} must be SKIP:COUNT (steps), e.g. 100:50; got {window!r}"
                ) from None
        if skip < 0 or count < 1:
            raise ValueError(f"{WINDOW_ENV} needs SKIP >= 0 and COUNT >= 1; got {window!r}")
        python = os.environ.get(PYTHON_ENV, "") not in ("", "0")
        return cls(Path(directory), rank, device, skip, count, python)

    def step_starts(self) -> None:
        """Called as each step is launched."""
        if self.steps == self.skip:
            self._start()
        elif self.steps == self.skip + self.count and self._profiling():
            self._finish()
        self.steps += 1

    def _profiling(self) -> bool:
        return self._profile is not None or self._python_profile is not None

    def _start(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.python:
            self._python_profile = cProfile.Profile()
            self._python_profile.enable()
        else:
            activities = [ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self._profile = profile(activities=activities)
            self._profile.__enter__()
        self._started = time.perf_counter()

    def _finish(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall = time.perf_counter() - self._started
        python_profile, self._python_profile = self._python_profile, None
        self.directory.mkdir(parents=True, exist_ok=True)
        if python_profile is not None:
            python_profile.disable()
            self._write_python_profile(python_profile, wall)
            return
        profile, self._profile = self._profile, None
        profile.__exit__(None, None, None)
        profile.export_chrome_trace(str(self.directory / f"rank{self.rank}.trace.json"))
        summary = summarize(profile.events(), self.count, wall)
        (self.directory / f"rank{self.rank}.json").write_text(json.dumps(summary, indent=1))
        print(
            f"[ladle] rank {self.rank} profiled {self.count} steps: wall "
            f"{summary['wall_ms_per_step']} ms/step, kernels busy "
            f"{summary['kernel_busy_ms_per_step']} ms/step -> {self.directory}",
            file=sys.stderr, flush=True,
        )


    def _write_python_profile(self, python_profile: cProfile.Profile, wall: float) -> None:
        python_profile.dump_stats(str(self.directory / f"rank{self.rank}.pstats"))
        wall_ms = round(wall * 1000 / self.count, 3)
        print(
            f"[ladle] rank {self.rank} profiled {self.count} steps in Python: wall {wall_ms} "
            f"ms/step under cProfile -> {self.directory}",
            file=sys.stderr,
            flush=True,
        )
        lines = [f"{self.count} steps, {wall_ms} ms a step under cProfile; own and cumulative us "
                 "a step, calls a step"]  # fmt: skip
        lines += [
            f"{row['own_us']:>9.1f} {row['cumulative_us']:>9.1f} {row['calls']:>7.2f}  "
            f"{row['function']}"
            for row in python_functions(pstats.Stats(python_profile), self.count)
        ]
        (self.directory / f"rank{self.rank}.python.txt").write_text("\n".join(lines) + "\n")


def python_functions(stats: pstats.Stats, steps: int, top: int = TOP_FUNCTIONS) -> list[dict]:
    """The functions with the most own time: own and cumulative microseconds and calls a step."""
    rows = [
        {
            "function": f"{Path(file).name}:{line}({name})",
            "own_us": own * 1e6 / steps,
            "cumulative_us": cumulative * 1e6 / steps,
            "calls": calls / steps,
        }
        for (file, line, name), (_, calls, own, cumulative, _) in stats.stats.items()
    ]
    return sorted(rows, key=lambda row: -row["own_us"])[:top]


def summarize(events, steps: int, wall_seconds: float) -> dict:
    """Per step: wall, kernel-busy and idle-gap milliseconds, the time in collectives (their
    kernels' busy time on CUDA, their host time on the CPU), and the kernels by GPU time."""
    events = list(events)
    kernels = [
        (event.time_range.start, event.time_range.end, event.name)
        for event in events
        if event.device_type == torch.autograd.DeviceType.CUDA
    ]
    if kernels:
        collective_us, _ = busy_and_gaps(
            (start, end) for start, end, name in kernels if COLLECTIVE.search(name)
        )
    else:
        collective_us, _ = busy_and_gaps(
            (event.time_range.start, event.time_range.end)
            for event in events
            if event.device_type == torch.autograd.DeviceType.CPU and COLLECTIVE.search(event.name)
        )
    by_name: dict[str, list[float]] = collections.defaultdict(list)
    for start, end, name in kernels:
        by_name[name].append(end - start)
    busy_us, gaps = busy_and_gaps((start, end) for start, end, _ in kernels)
    # Without the collectives' kernels, which also count while they wait for a peer (a pipeline
    # stage's receive waits for the stage before it): the share of the wall spent computing.
    compute_us, _ = busy_and_gaps(
        (start, end) for start, end, name in kernels if not COLLECTIVE.search(name)
    )
    table = sorted(
        (
            {"kernel": name[:110], "us_per_step": round(sum(times) / steps, 1),
             "per_step": round(len(times) / steps, 2)}
            for name, times in by_name.items()
        ),
        key=lambda row: -row["us_per_step"],
    )
    return {
        "steps": steps,
        "wall_ms_per_step": round(wall_seconds * 1000 / steps, 3),
        "kernel_busy_ms_per_step": round(busy_us / 1000 / steps, 3),
        "busy_fraction": round(busy_us / 1e6 / wall_seconds, 3) if wall_seconds else None,
        "compute_busy_fraction": (
            round(compute_us / 1e6 / wall_seconds, 3) if wall_seconds and kernels else None
        ),
        "gaps_per_step": round(len(gaps) / steps, 1),
        "gap_ms_per_step": round(sum(gaps) / 1000 / steps, 3),
        "collective_ms_per_step": round(collective_us / 1000 / steps, 3),
        "kernels": table[:TOP_KERNELS],
    }
