"""`ladle bench serve --compare-disaggregation` end to end on the CPU: it starts a 1P1D server
and a two-replica server in turn on the tiny model, runs the same token-id workload against
each, and writes a comparison with goodput for both modes (every request completed); and
`--compare-replicas` (two replicas against one) the same way, with its scaling figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ladle.bench.disagg_compare import _row, replica_scaling


def test_compare_disaggregation_runs_both_modes(tiny_model_path, tmp_path):
    output = tmp_path / "cmp"
    command = [
        sys.executable, "-m", "ladle.cli", "bench", "serve", "--compare-disaggregation",
        "--serve-args", f"{tiny_model_path('llama')} --cpu-kv-cache-gib 0.05 --block-size 16",
        "--workload", "token-ids", "--input-len", "20:40", "--output-len", "4:8",
        "--max-token-id", "200", "--num-prompts", "6", "--rate", "inf", "--ignore-eos",
        "--slo", "ttft=30s,itl=10s", "--no-plots", "--disable-tqdm", "--output-dir", str(output),
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(Path(output / "compare.json").read_text())["rows"]
    assert [row["mode"] for row in rows] == ["disaggregated 1P1D", "2 aggregated replicas"]
    for row in rows:
        assert row["num_errors"] == 0 and row["goodput"] == row["request_throughput"] > 0
    assert "wins" in done.stdout
    assert (output / "1p1d" / "results.json").exists()
    assert (output / "2replicas" / "results.json").exists()


def test_row_reads_a_runs_summary():
    summary = {"goodput": 2.0, "request_throughput": 3.0, "output_throughput": 30.0,
               "ttft_ms": {"p99": 12.5}, "itl_ms": {"p99": None}, "num_errors": 1}
    row = _row("m", {"rate": 4.0, "max_concurrency": None, "summary": summary})
    assert row["goodput"] == 2.0 and row["ttft_p99_ms"] == 12.5 and row["itl_p99_ms"] is None


def test_compare_replicas_runs_two_and_one(tiny_model_path, tmp_path):
    """The scale-out check (two replicas against one) as a mode of the same tool."""
    output = tmp_path / "replicas"
    command = [
        sys.executable, "-m", "ladle.cli", "bench", "serve", "--compare-replicas",
        "--serve-args", f"{tiny_model_path('llama')} --cpu-kv-cache-gib 0.05 --block-size 16",
        "--workload", "token-ids", "--input-len", "8:16", "--output-len", "4:6",
        "--max-token-id", "200", "--num-prompts", "6", "--rate", "inf", "--ignore-eos",
        "--slo", "ttft=60s", "--no-plots", "--disable-tqdm", "--output-dir", str(output),
    ]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(Path(output / "compare.json").read_text())
    assert [row["mode"] for row in report["rows"]] == ["2 replicas", "1 replica"]
    assert all(row["num_errors"] == 0 for row in report["rows"])
    two, one = (row["output_throughput"] for row in report["rows"])
    scaling = report["scaling"]
    assert scaling["ratio_at_bound"] == pytest.approx(two / one)
    assert scaling["points"][0]["ratio"] == pytest.approx(two / one)
    assert "one replica's output throughput" in done.stdout and "target 1.8x" in done.stdout
    assert (output / "1replica" / "results.json").exists()


def _run(mode: str, rate: float, throughput: float, ttft_p99_ms: float) -> dict:
    return {"mode": mode, "rate": rate, "max_concurrency": None,
            "output_throughput": throughput, "ttft_p99_ms": ttft_p99_ms}


def test_replica_scaling_takes_each_modes_best_within_the_bound():
    rows = [
        _run("2 replicas", 10, 1000.0, 300.0), _run("2 replicas", 20, 1900.0, 900.0),
        _run("1 replica", 10, 950.0, 800.0), _run("1 replica", 20, 1000.0, 5000.0),
    ]
    scaling = replica_scaling(rows, ttft_bound_s=1.0)
    # One replica saturates at rate 20 (its TTFT p99 past the bound): its 1000 tok/s there
    # does not count; two replicas' 1900 does.
    assert scaling["best_output_throughput"] == {"2 replicas": 1900.0, "1 replica": 950.0}
    assert scaling["ratio_at_bound"] == pytest.approx(2.0) and scaling["meets_target"]
    assert [p["ratio"] for p in scaling["points"]] == pytest.approx([1000 / 950, 1.9])
    unbounded = replica_scaling(rows, ttft_bound_s=None)
    assert unbounded["ratio_at_bound"] == pytest.approx(1.9) and unbounded["meets_target"]
    nothing_within = replica_scaling(rows, ttft_bound_s=0.1)
    assert nothing_within["ratio_at_bound"] is None and not nothing_within["meets_target"]
