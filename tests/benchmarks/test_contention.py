"""The contention harness on a short run: it measures quiet and busy runs alternately, with the
busy processes really running during the busy ones and gone afterwards. Not a speed assertion:
the speeds themselves are recorded in docs/benchmarks.md."""

from __future__ import annotations

import contention
import pytest

from tests.entrypoints.server_process import process_is_running


def test_busy_processes_run_only_inside_the_block():
    with contention.busy_processes(2) as processes:
        pids = [p.pid for p in processes]
        assert all(process_is_running(pid) for pid in pids)
    assert not any(process_is_running(pid) for pid in pids)


def check(results: list[dict], cases: list[str]) -> None:
    assert [r["case"] for r in results] == cases
    for result in results:
        assert len(result["quiet_tok_s"]) == len(result["contended_tok_s"]) == 2
        assert all(speed > 0 for speed in result["quiet_tok_s"] + result["contended_tok_s"])
        assert result["ratio"] == pytest.approx(result["contended_median"] / result["quiet_median"])


ARGS = [
    "--model",
    "tiny-llama",
    "--load-format",
    "dummy",
    "--busy",
    "1",
    "--runs",
    "2",
    "--prompt-len",
    "4",
    "--output-len",
    "3",
    "--cpu-kv-cache-gib",
    "0.01",
]


def test_offline_short_run(tmp_path):
    output = tmp_path / "results.json"
    results = contention.main(
        [*ARGS, "--cases", "offline-1", "offline-2", "--output-json", str(output)]
    )
    check(results, ["offline-1", "offline-2"])
    assert output.read_text().startswith("[")


@pytest.mark.slow  # starts its own server
def test_serve_short_run():
    check(contention.main([*ARGS, "--cases", "serve-2"]), ["serve-2"])
