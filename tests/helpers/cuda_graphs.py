"""Capturing a step in a CUDA graph for the GPU tests: warmed up once on a side stream (so lazy
allocations and kernel builds happen outside the capture), then captured."""

from __future__ import annotations

from collections.abc import Callable

import torch


def capture(step: Callable[[], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """(the graph, the output tensor that each replay rewrites)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = step()
    return graph, output
