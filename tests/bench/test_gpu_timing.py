"""The profiled kernel timeline's busy time and gaps (ladle.bench.gpu_timing), by hand."""

from __future__ import annotations

from ladle.bench.gpu_timing import busy_and_gaps


def test_overlaps_count_once_and_gaps_are_the_idle_stretches():
    # Out of order, one kernel inside another, one touching the next: busy [0, 5] + [7, 10].
    intervals = [(7.0, 9.0), (0.0, 3.0), (1.0, 2.0), (3.0, 5.0), (8.0, 10.0)]
    assert busy_and_gaps(intervals) == (8.0, [2.0])


def test_no_kernels_is_no_time():
    assert busy_and_gaps([]) == (0.0, [])
