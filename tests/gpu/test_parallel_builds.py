"""Start-up's Triton builds on a thread pool and graph captures without an eager run first
(kernels/parallel_builds.py, worker/graph_capture.py), against plain torch.

Each test uses a kernel variant no other test builds (a constexpr value of its own), so the
variant is cold when the test starts, whatever ran before in the process."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, FACTOR: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * FACTOR, mask=mask)


def _scale(x: torch.Tensor, factor: int) -> torch.Tensor:
    out = torch.zeros_like(x)
    _scale_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), FACTOR=factor, BLOCK=256)
    return out


def test_builds_only_builds_without_launching_and_the_real_run_builds_nothing():
    from ladle.kernels.compile_log import compile_totals, start_compile_log
    from ladle.kernels.parallel_builds import builds_only

    start_compile_log()
    x = torch.randn(1000, device="cuda")
    before = compile_totals()
    with builds_only(max_workers=4) as active:
        assert active
        skipped = [_scale(x, factor) for factor in (3, 5, 7)]
    built = compile_totals().since(before)
    assert built.num_builds == 3
    for output in skipped:  # nothing ran: the outputs keep torch's zeros
        assert torch.count_nonzero(output).item() == 0
    before = compile_totals()
    for factor in (3, 5, 7):
        torch.testing.assert_close(_scale(x, factor), x * factor)
    assert compile_totals().since(before).num_builds == 0


def test_capture_without_an_eager_run_redoes_a_capture_that_needs_a_build():
    from ladle.worker.graph_capture import CaptureTimes, capture_graph

    x = torch.randn(4096, device="cuda")
    pool = torch.cuda.graph_pool_handle()
    times = CaptureTimes()
    # Variant 11 is cold: the capture stops before building it, runs eagerly, then captures.
    graph, output = capture_graph(
        lambda: _scale(x, 11), pool, x.device, times, run_eagerly_first=False
    )
    assert (times.num_retries, times.num_eager_runs) == (1, 1)
    # Now warm: captured directly.
    graph_again, output_again = capture_graph(
        lambda: _scale(x, 11) + 1, pool, x.device, times, run_eagerly_first=False
    )
    assert (times.num_retries, times.num_eager_runs) == (1, 1)
    x.copy_(torch.randn_like(x))
    graph.replay()
    graph_again.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(output, x * 11)
    torch.testing.assert_close(output_again, x * 11 + 1)
