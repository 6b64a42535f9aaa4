"""Timing GPU work for the kernel benchmarks and profiles: calls replayed from a CUDA graph, and
the busy time and gaps of a profiled kernel timeline. Imports torch only (CUDA at call time)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable

import torch

# The decoder projections of Llama-3.1-8B (merged q/k/v and gate/up), output x input columns:
# the shapes the kernel benchmarks time.
PROJECTIONS_8B = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
}
# Bytes of weights a benchmark cycles through, each call on its own, so that none is read from
# L2 (50 MiB on an H100) the way no decode step reads a weight twice.
WEIGHT_RING_BYTES = 160 << 20


def input_ring(rows: int, columns: int, total_bytes: int = 64_000_000) -> list[torch.Tensor]:
    """Random bf16 [rows, columns] CUDA inputs, at least four and together larger than L2, for
    calls that each take the next one: every call then reads fresh memory, as each layer of a
    decode step does."""
    count = max(4, total_bytes // (rows * columns * 2))
    return [torch.randn(rows, columns, device="cuda").bfloat16() for _ in range(count)]


def capture_graph(step: Callable[[], object]) -> tuple[torch.cuda.CUDAGraph, object]:
    """(a CUDA graph of step, the output that each replay rewrites): step is run once on a side
    stream first, so that lazy allocations and kernel builds happen outside the capture."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = step()
    return graph, output


def calls_in_graph_us(
    calls: list[Callable[[], object]], replays: int = 4, samples: int = 5
) -> float:
    """Microseconds per call: the calls (each run once eagerly first) captured back to back into
    one CUDA graph, as a decode graph runs them (no launch gaps); the median over `samples`
    timings of `replays` replays each."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / (replays * len(calls)))
    return statistics.median(times)


def busy_and_gaps(intervals: Iterable[tuple[float, float]]) -> tuple[float, list[float]]:
    """The union's length of (start, end) kernel intervals (any order, overlaps counted once)
    and the idle gaps between them, in the intervals' unit."""
    ordered = sorted(intervals)
    if not ordered:
        return 0.0, []
    busy, gaps = 0.0, []
    current_start, current_end = ordered[0]
    for start, end in ordered[1:]:
        if start > current_end:
            busy += current_end - current_start
            gaps.append(start - current_end)
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    return busy + current_end - current_start, gaps
