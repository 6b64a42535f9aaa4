"""served_path_bench's engine side of item 6: the engine's inter-token histogram over the run
(the last /metrics scrape less the first), against figures worked out by hand."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ladle.engine.token_gap_meter import ENGINE_ITL_BOUNDS_S
from ladle.frontend.metrics import ServerMetrics
from ladle.protocol.messages import SchedulerStats

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "served_path_bench.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("served_path_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scrape(counts_by_bound: dict[float, int], total_s: float) -> str:
    counts = [0] * (len(ENGINE_ITL_BOUNDS_S) + 1)
    for bound, count in counts_by_bound.items():
        counts[ENGINE_ITL_BOUNDS_S.index(bound)] = count
    metrics = ServerMetrics("m")
    metrics.record_engine_stats(
        SchedulerStats(engine_itl_counts=tuple(counts), engine_itl_seconds=total_s)
    )
    return metrics.render().decode()


def test_engine_itl_over_the_run_subtracts_the_scrape_before_the_load():
    bench = _bench_module()
    # Before the load: 3 slow gaps (a previous run, say). During it: 2 gaps in (6.5, 7] ms and
    # 6 in (7, 7.5] ms, 0.058 s in all.
    before = _scrape({0.02: 3}, 0.054)
    after = _scrape({0.02: 3, 0.007: 2, 0.0075: 6}, 0.054 + 0.058)
    result = bench.engine_itl_over_run(before, after)
    assert result["engine_itl_tokens"] == 8
    assert abs(result["engine_itl_ms_mean"] - 58 / 8) < 1e-9
    # The 4th of 8 lies 2/6 into the (7, 7.5] ms bucket: 7 + 0.5 / 3 ms.
    assert abs(result["engine_itl_ms_p50"] - (7 + 0.5 / 3)) < 1e-9


def test_a_server_without_the_metric_gives_no_engine_figures():
    bench = _bench_module()
    assert bench.engine_itl_over_run("", "") == {
        "engine_itl_tokens": 0,
        "engine_itl_ms_mean": None,
        "engine_itl_ms_p50": None,
    }
