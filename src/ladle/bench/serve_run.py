"""Runs the points of a `ladle bench serve` plan against a server and writes the results."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import random
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import httpx
import numpy as np
from tqdm import tqdm

import ladle
from ladle.bench.serve_client import BenchRequest, send_request
from ladle.bench.serve_plots import plot_runs
from ladle.bench.serve_scrape import MetricsPoller, scrape, server_report
from ladle.bench.serve_stats import RequestRecord, format_summary, summarize
from ladle.bench.serve_workloads import WorkloadOptions, build_workload, tool_definitions
from ladle.model.default_model import resolve_default_model
from ladle.model.tokenizer import load_tokenizer

DEFAULT_SERVED_NAME = "SmolLM2-135M-Instruct"
T = TypeVar("T")


@dataclass
class BenchPlan:
    base_url: str
    model: str | None
    api_key: str | None
    tokenizer: str | None
    mix: dict[str, float]
    num_prompts: int
    points: list[tuple[float, int | None]]  # (rate, max concurrency) per run
    burstiness: float
    seed: int
    temperature: float
    ignore_eos: bool
    token_ids: bool
    input_len: tuple[int, int]
    output_len: tuple[int, int]
    sharegpt_path: str | None
    priority_fraction: float | None
    slo: dict[str, float]
    gpu_hour_cost: float | None
    output_dir: Path
    label: str
    max_token_id: int = 10000
    duration_s: float | None = None  # finite rates send rate x this many requests
    plots: bool = True
    progress: bool = True
    request_timeout: float = 600.0

    def num_requests(self, rate: float) -> int:
        """Requests a point at this rate sends: rate x duration_s when set (at least one), else
        num_prompts."""
        if self.duration_s is None or math.isinf(rate):
            return self.num_prompts
        return max(1, round(rate * self.duration_s))

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def arrival_offsets(num_requests: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """Seconds after the start at which each request leaves: gamma gaps of mean 1/rate and shape
    burstiness (1: Poisson), the first at 0; all at 0 for an infinite rate."""
    if math.isinf(rate):
        return [0.0] * num_requests
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num_requests)
    gaps[0] = 0.0
    return np.cumsum(gaps).tolist()


class _TextTokenizer:
    """The workloads' view of a ladle TextTokenizer: no special tokens added."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)


def resolve_tokenizer(plan: BenchPlan, model: str):
    """The server's tokenizer for sizing text prompts, or None (token-id prompts)."""
    if plan.token_ids:
        return None
    source = plan.tokenizer
    if source is None and model == DEFAULT_SERVED_NAME:
        source = str(resolve_default_model(show_progress=False))
    if source is None and Path(model).exists():
        source = model
    if source is None:
        print(
            f"[bench] no tokenizer for {model!r} (pass --tokenizer); sending token-id prompts",
            file=sys.stderr,
        )
        return None
    return _TextTokenizer(load_tokenizer(source))


async def _served_model(http: httpx.AsyncClient, plan: BenchPlan) -> str:
    try:
        response = await http.get(plan.base_url + "/v1/models", headers=plan.headers)
    except httpx.HTTPError as error:
        raise ValueError(
            f"cannot reach a server at {plan.base_url} ({type(error).__name__}: {error}); "
            "is it running? (--base-url)"
        ) from None
    if response.status_code != 200:
        raise ValueError(
            f"GET {plan.base_url}/v1/models answered {response.status_code}: {response.text[:200]}"
        )
    return response.json()["data"][0]["id"]


async def tools_refusal(http: httpx.AsyncClient, plan: BenchPlan, model: str) -> str | None:
    """None when the server takes a request with tools; else why it refused."""
    body = {
        "model": model,
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
        "tools": tool_definitions(["get_weather", "search_web"]),
        "tool_choice": "auto",
    }
    response = await http.post(
        plan.base_url + "/v1/chat/completions", json=body, headers=plan.headers
    )
    if response.status_code == 200:
        return None
    return f"HTTP {response.status_code}: {response.text[:300]}"


async def run_point(
    http: httpx.AsyncClient,
    streams: aiohttp.ClientSession,
    plan: BenchPlan,
    model: str,
    requests: list[BenchRequest],
    rate: float,
    concurrency: int | None,
) -> tuple[list[RequestRecord], float, dict | None]:
    """Send every request on the arrival schedule; returns records, wall time, server report."""
    offsets = arrival_offsets(len(requests), rate, plan.burstiness, plan.seed)
    limit = asyncio.Semaphore(concurrency) if concurrency else contextlib.nullcontext()
    progress = None
    if plan.progress:
        label = "inf" if math.isinf(rate) else f"{rate:g}/s"
        progress = tqdm(total=len(requests), desc=f"rate {label}", file=sys.stderr, leave=False)
    before = await scrape(http, plan.base_url)
    poller = MetricsPoller(http, plan.base_url)
    poller_task = asyncio.create_task(poller.run()) if before is not None else None
    records: list[RequestRecord] = []

    async def one(index: int, request: BenchRequest) -> None:
        record = RequestRecord(
            index,
            request.workload,
            scheduled_start=offsets[index],
            priority=request.extra_body.get("priority", 0),
        )
        records.append(record)
        async with limit:
            await send_request(
                streams, plan.base_url, request, record, model, plan.temperature, plan.headers,
                started,
            )
        if progress is not None:
            progress.update(1)

    started = time.perf_counter()
    tasks = []
    for index, request in enumerate(requests):
        delay = started + offsets[index] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(index, request)))
    await asyncio.gather(*tasks)
    duration = time.perf_counter() - started
    if poller_task is not None:
        poller_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller_task
    if progress is not None:
        progress.close()
    after = await scrape(http, plan.base_url)
    records.sort(key=lambda r: r.index)
    return records, duration, server_report(before, after, poller.samples)


def _groups(records: list[RequestRecord], key) -> dict[str, list[RequestRecord]]:
    groups: dict[str, list[RequestRecord]] = {}
    for record in records:
        groups.setdefault(str(key(record)), []).append(record)
    return groups


def run_event_loop(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on uvloop when it is installed: its loop costs the client about half the CPU
    per streamed event of asyncio's own (scripts/served_path_bench.py)."""
    try:
        import uvloop  # optional: not a dependency of ladle nor of its `bench` extra
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def open_http_client(plan: BenchPlan) -> httpx.AsyncClient:
    """The client of the few control requests: /v1/models, /metrics, the tools probe."""
    timeout = httpx.Timeout(plan.request_timeout, connect=30.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


def open_stream_session(plan: BenchPlan) -> aiohttp.ClientSession:
    """The session every timed request streams through (serve_client.py says why aiohttp)."""
    # request_timeout bounds each wait (to connect, between reads), as httpx's timeout did, not
    # the whole stream: a long generation that keeps streaming is not cut off.
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=30.0, sock_read=plan.request_timeout
    )
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),  # --max-concurrency is the only bound
        timeout=timeout,
    )


async def run_plan(plan: BenchPlan) -> dict | None:
    """Every point of the plan, then results.json and the plots; None if nothing could run."""
    async with open_http_client(plan) as http, open_stream_session(plan) as streams:
        model = plan.model or await _served_model(http, plan)
        mix = dict(plan.mix)
        skipped = {}
        if "tool-calling" in mix:
            refusal = await tools_refusal(http, plan, model)
            if refusal is not None:
                skipped["tool-calling"] = f"the server refused a request with tools ({refusal})"
                print(f"[bench] tool-calling skipped: {skipped['tool-calling']}", file=sys.stderr)
                del mix["tool-calling"]
        result = {
            "ladle_version": ladle.__version__,
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "label": plan.label,
            "base_url": plan.base_url,
            "model": model,
            "workload": plan.mix,
            "skipped_workloads": skipped,
            "num_prompts": plan.num_prompts,
            "duration_s": plan.duration_s,
            "burstiness": plan.burstiness,
            "seed": plan.seed,
            "temperature": plan.temperature,
            "slo_ms": {k: v * 1000.0 for k, v in plan.slo.items()},
            "gpu_hour_cost": plan.gpu_hour_cost,
            "runs": [],
            "plots": [],
        }
        if not mix:
            print("[bench] nothing left to run", file=sys.stderr)
            write_json(plan.output_dir / "results.json", result)
            return result
        tokenizer = await asyncio.to_thread(resolve_tokenizer, plan, model)
        options = WorkloadOptions(
            num_requests=plan.num_prompts,
            seed=plan.seed,
            tokenizer=tokenizer,
            input_len=plan.input_len,
            output_len=plan.output_len,
            ignore_eos=plan.ignore_eos,
            sharegpt_path=plan.sharegpt_path,
            max_token_id=plan.max_token_id,
        )
        all_records = []
        for point, (rate, concurrency) in enumerate(plan.points):
            # Each point of a sweep gets requests of its own seed: the same prompts again would
            # hit the prefix cache the previous point filled. (The standard workloads keep their
            # fixed definition.)
            point_options = dataclasses.replace(
                options, seed=plan.seed + point, num_requests=plan.num_requests(rate)
            )
            requests = await asyncio.to_thread(build_workload, mix, point_options)
            if plan.priority_fraction is not None:
                rng = random.Random(plan.seed + point + 7)
                for request in requests:
                    high = rng.random() < plan.priority_fraction
                    request.extra_body["priority"] = 0 if high else 1
            records, duration, server = await run_point(
                http, streams, plan, model, requests, rate, concurrency
            )
            summary = summarize(records, duration, plan.slo, plan.gpu_hour_cost)
            run = {
                "rate": rate,
                "max_concurrency": concurrency,
                "summary": summary,
                "server_metrics": server,
            }
            if len(mix) > 1:
                run["by_workload"] = {
                    name: summarize(group, duration, plan.slo, plan.gpu_hour_cost)
                    for name, group in _groups(records, lambda r: r.workload).items()
                }
            if plan.priority_fraction is not None:
                run["by_priority"] = {
                    name: summarize(group, duration, plan.slo, plan.gpu_hour_cost)
                    for name, group in _groups(records, lambda r: r.priority).items()
                }
            run["records"] = [r.to_json() for r in records]
            result["runs"].append(run)
            all_records.append(records)
            label = "inf" if math.isinf(rate) else f"{rate:g}/s"
            if concurrency:
                label += f", max concurrency {concurrency}"
            print(format_summary(summary, f"{plan.label} @ {label}"))
            if server is not None:
                print(
                    "server: "
                    + ", ".join(
                        f"{k} {v:.3g}" for k, v in server.items() if isinstance(v, float | int)
                    )
                )
        if len(plan.points) > 1:
            best = max(result["runs"], key=lambda r: r["summary"]["request_throughput"])
            result["saturation_request_throughput"] = best["summary"]["request_throughput"]
        if plan.plots:
            result["plots"] = plot_runs(result["runs"], all_records, plan.output_dir, plan.label)
        write_json(plan.output_dir / "results.json", result)
        return result


def json_default(value):
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # inf rates are written as the string "inf" (JSON has no infinity).
    text = json.dumps(_finite(data), indent=1, default=json_default)
    path.write_text(text)


def _finite(value):
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
