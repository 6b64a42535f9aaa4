"""`ladle bench serve --compare-disaggregation` end to end on the CPU: it starts a 1P1D server
and a two-replica server in turn on the tiny model, runs the same token-id workload against
each, and writes a comparison with goodput for both modes (every request completed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ladle.bench.disagg_compare import _row


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
