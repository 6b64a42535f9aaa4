"""Capturing one CUDA graph, with an eager run first only when the capture needs one.

A Triton kernel variant cannot be built inside a capture, so each bucket used to run its
forward eagerly before capturing it: ~100 buckets on an 8B model, each eager forward hundreds
of launches from Python. Most buckets need no new variant (an earlier bucket or the start-up's
build pass built it), so a capture is tried directly, under `no_builds()`; if a launch in it
would build, the capture is abandoned before the build, the forward runs eagerly (building
outside any capture) and the capture is redone. The first capture of a pool always runs the
eager forward first: it also does the lazy one-time set-up (library handles, workspaces)
outside the capture.

LADLE_EAGER_RUN_BEFORE_CAPTURE=1 brings back an eager run before every capture.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ladle.kernels.parallel_builds import TritonBuildNeeded, no_builds


@dataclass
class CaptureTimes:
    """Where a capture loop's seconds went (start-up log and scripts/startup_profile.py)."""

    eager_seconds: float = 0.0
    capture_seconds: float = 0.0
    num_eager_runs: int = 0
    num_retries: int = 0  # captures abandoned because a launch needed a build

    def describe(self) -> str:
        return (
            f"eager runs {self.num_eager_runs} ({self.eager_seconds:.1f} s), captures "
            f"{self.capture_seconds:.1f} s, {self.num_retries} redone after a build"
        )


def _always_run_eagerly() -> bool:
    return os.environ.get("LADLE_EAGER_RUN_BEFORE_CAPTURE", "0") == "1"


def capture_graph(
    run: Callable[[], torch.Tensor],
    pool,
    device: torch.device,
    times: CaptureTimes,
    *,
    run_eagerly_first: bool,
) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """run() captured into a new graph that allocates from pool; returns it and its output."""
    if not (run_eagerly_first or _always_run_eagerly()):
        try:
            return _capture(run, pool, device, times, refuse_builds=True)
        except TritonBuildNeeded:
            times.num_retries += 1
            torch.cuda.synchronize(device)
    started = time.perf_counter()
    run()
    torch.cuda.synchronize(device)
    times.eager_seconds += time.perf_counter() - started
    times.num_eager_runs += 1
    return _capture(run, pool, device, times, refuse_builds=False)


# torch.cuda.graph's default capture stream is one per process, made on whichever GPU was
# current at the first capture; an engine on another GPU of the same process (a disaggregated
# pair, two replicas in one test) would capture on a stream of the wrong device. One per device.
_capture_streams: dict[torch.device, torch.cuda.Stream] = {}


def capture_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream graphs on `device` are captured on."""
    device = torch.device("cuda", device.index if device.index is not None
                          else torch.cuda.current_device())
    stream = _capture_streams.get(device)
    if stream is None:
        stream = _capture_streams[device] = torch.cuda.Stream(device)
    return stream


def _capture(run, pool, device: torch.device, times: CaptureTimes, refuse_builds: bool):
    started = time.perf_counter()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.device(device), torch.cuda.graph(graph, pool=pool,
                                                         stream=capture_stream(device)):
            if refuse_builds:
                with no_builds():
                    output = run()
            else:
                output = run()
    finally:
        times.capture_seconds += time.perf_counter() - started
    return graph, output
