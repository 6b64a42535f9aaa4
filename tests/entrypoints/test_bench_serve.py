"""`ladle bench serve` against a real `ladle serve` of the default model, and the server's TTFT
SLO admission under a burst it cannot serve in time.

One server for both (started with --ttft-slo and --itl-slo, so the SLO paths also run under the
benchmark). Requests are tiny: the point is the plumbing and the arithmetic, not the speed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from tests.entrypoints.server_process import ServerProcess, wait_until

TTFT_SLO_S = 2.0
PERCENTILE_KEYS = ("p50", "p90", "p95", "p99")


@pytest.fixture(scope="module")
def slo_server():
    server = ServerProcess(
        [
            "--max-num-seqs",
            "64",
            "--ttft-slo",
            f"{TTFT_SLO_S}s",
            "--itl-slo",
            "2s",
            "--stats-interval",
            "1",
        ]
    ).start(timeout_s=900)
    yield server
    server.stop()


def test_bench_serve_writes_every_field_consistent_percentiles_and_plots(slo_server, tmp_path):
    output_dir = tmp_path / "bench"
    command = [
        sys.executable,
        "-m",
        "ladle.cli",
        "bench",
        "serve",
        "--base-url",
        slo_server.base_url,
        "--workload",
        "token-ids",
        "--input-len",
        "8:24",
        "--output-len",
        "3:6",
        "--num-prompts",
        "4",
        "--sweep",
        "20,inf",
        "--max-concurrency",
        "3",
        "--slo",
        "ttft=10s,itl=5s",
        "--gpu-hour-cost",
        "2.5",
        "--output-dir",
        str(output_dir),
        "--disable-tqdm",
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert finished.returncode == 0, finished.stderr
    assert "TTFT ms" in finished.stdout and "goodput" in finished.stdout
    result = json.loads((output_dir / "results.json").read_text())
    for key in (
        "model",
        "workload",
        "num_prompts",
        "burstiness",
        "seed",
        "slo_ms",
        "runs",
        "plots",
        "gpu_hour_cost",
        "saturation_request_throughput",
    ):
        assert key in result, key
    assert result["model"] == "SmolLM2-135M-Instruct"
    assert [run["rate"] for run in result["runs"]] == [20.0, "inf"]
    for run in result["runs"]:
        summary, records = run["summary"], run["records"]
        assert run["max_concurrency"] == 3
        assert len(records) == summary["num_requests"] == 4
        assert summary["num_completed"] + summary["num_errors"] == 4
        for key in (
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
            "goodput",
            "num_good",
            "error_rate",
            "rate_limited_rate",
            "cost_per_million_output_tokens",
            "duration_s",
            "errors",
        ):
            assert key in summary, key
        ok = [r for r in records if r["success"]]
        assert ok, records
        for record in ok:
            assert 8 <= record["prompt_tokens"] <= 24
            assert record["output_tokens"] == len(record["itl"]) + 1  # one token per chunk here
            assert record["e2e"] >= record["ttft"] > 0
        samples = {
            "ttft": [r["ttft"] for r in ok],
            "e2e": [r["e2e"] for r in ok],
            "tpot": [r["tpot"] for r in ok if r["tpot"] is not None],
            "itl": [gap for r in ok for gap in r["itl"]],
        }
        for metric, values in samples.items():
            figures = summary[f"{metric}_ms"]
            assert figures["mean"] == pytest.approx(np.mean(values) * 1000)
            for key in PERCENTILE_KEYS:
                expected = np.percentile(np.asarray(values) * 1000, int(key[1:]))
                assert figures[key] == pytest.approx(expected), (metric, key)
        output_tokens = sum(r["output_tokens"] for r in ok)
        assert summary["total_output_tokens"] == output_tokens
        assert summary["cost_per_million_output_tokens"] == pytest.approx(
            2.5 * summary["duration_s"] / 3600 / output_tokens * 1e6
        )
        server = run["server_metrics"]
        assert server is not None
        assert server["prefix_cache_queries"] >= sum(r["prompt_tokens"] for r in ok)
        assert server["preemptions"] == 0
    for name in ("latency_cdf.png", "throughput.png", "p99.png"):
        path = output_dir / name
        assert str(path) in result["plots"]
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def _stream(http: httpx.AsyncClient, url: str, prompt: list[int], max_tokens: int):
    """(status, TTFT or Retry-After header)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    started = time.perf_counter()
    async with http.stream("POST", url + "/v1/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return response.status_code, response.headers.get("retry-after"), response.text
        ttft = None
        async for line in response.aiter_lines():
            if ttft is None and line.startswith("data:") and '"text"' in line:
                ttft = time.perf_counter() - started
        return 200, ttft, ""


def test_ttft_slo_admission_refuses_what_it_cannot_serve_in_time(slo_server):
    async def burst():
        async with httpx.AsyncClient(timeout=300) as http:
            # One request alone first, so the engine has measured its prefill rate.
            warm = await _stream(http, slo_server.base_url, list(range(500, 600)), 2)
            assert warm[0] == 200
            # Short prompts, so one alone fits the SLO even on a slow CPU (a request with
            # nothing queued ahead is always let in); together far more than it.
            prompts = [list(range(1000 + 67 * i, 1064 + 67 * i)) for i in range(48)]
            return await asyncio.gather(
                *[_stream(http, slo_server.base_url, p, 4) for p in prompts]
            )

    results = asyncio.run(burst())
    accepted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] == 429]
    assert len(accepted) + len(refused) == 48
    assert accepted and refused, results
    for _, retry_after, body in refused:
        assert int(retry_after) >= 1
        assert "exceeds the TTFT SLO" in body
    # Every request let in got its first token within the SLO.
    assert max(ttft for _, ttft, _ in accepted) <= TTFT_SLO_S
    assert wait_until(lambda: "[ladle] refused a request (429)" in slo_server.log(), 10)
    assert wait_until(lambda: "[ladle] running " in slo_server.log(), 10)
