"""Who makes a served stream late: the API process, the engine's output path, or the client?

    PYTHONPATH=src python scripts/served_path_bench.py --server api --client bench \
        --concurrency 128 256 --step-ms 7 --json out.json

S1's requests (256 token-id prompts, max_tokens U[100, 512], logprobs 0, ignore_eos) go, at
each --concurrency, to a fresh server of one of three kinds:

- `api`: the real `ladle serve` (`python -m ladle.bench.paced_serve`), whose engine-core process
  is a paced stand-in: one token per running request every --step-ms, through the real
  EngineCoreLoop and ZMQ wire. At 128 streams and 7 ms that is S1's ~18,000 events/s.
- `stub`: `python -m ladle.bench.sse_stub_server`, which writes prebuilt chunks on the same
  clock: the client alone.
- `real`: `ladle serve qwen3-0.6b --load-format dummy`, the real engine (S1 itself, on a GPU).

and are read by one of these clients, each in a process of its own:

- `bench`: `ladle bench serve`'s own request path (`ladle.bench.serve_run.run_point`).
- `raw`: a bare asyncio reader (no HTTP library, no JSON parsing), timing each read.

Per level it reports the output tok/s (ideal: streams x 1000 / step_ms), the client's
inter-token times against the known step (a p50 far under the step means tokens arrive in
bunches), and the CPU time per output token of each process (client, API, engine), measured
from /proc by psutil: CPU time is robust to a loaded machine where wall time is not. A process
near 1 s of CPU per second of wall time is saturated and bunches what it handles.

Item 6's comparison (a line on stderr per level, and the JSON's client_itl_* / engine_itl_* /
itl_*_client_over_engine): the client's mean inter-token time per token (first to last token of
each stream over its tokens after the first, summed over the streams) and its p50 gap, against
the engine's own figure for the same tokens, `ladle:engine_inter_token_latency_seconds` over the
run (the last /metrics scrape less the one before the load): each running stream's wait since
the engine sent its previous token. Equal token counts on both sides confirm the windows match.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil

ENGINE_PID_LINE = re.compile(r"engine core running in process (\d+)")
GC_PROBE_LINE = re.compile(
    r"\[gc-probe\] collections per generation (\[.*?\]), seconds (\[.*?\]), longest ([\d.]+) ms"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def s1_payloads(num_prompts: int, model: str) -> list[dict]:
    """S1's request bodies, exactly as `ladle bench serve --workload S1 --token-ids` sends them."""
    from ladle.bench.serve_workloads import WorkloadOptions, build_workload

    options = WorkloadOptions(
        num_requests=num_prompts, seed=0, tokenizer=None, input_len=(100, 1024),
        output_len=(100, 512), ignore_eos=True, sharegpt_path=None,
    )
    return [request.payload(model, 0.6) for request in build_workload({"S1": 1.0}, options)]


# ----- clients (each runs in its own process: `--role client`) ---------------------------------


async def _raw_stream(host: str, port: int, body: bytes, record: dict) -> None:
    """One completion over a bare connection: a timestamp per read, per event in it."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    await writer.drain()
    times, sizes = record["times"], record["sizes"]
    pending = b""
    done = False
    while not done and (data := await reader.read(65536)):
        now = time.perf_counter()
        pending += data
        *events, pending = pending.split(b"\n\n")
        for event in events:
            if b"data: [DONE]" in event:
                done = True
            elif b'"choices":[{' in event:
                times.append(now)
                sizes.append(_tokens_in(event))
    writer.close()


def _tokens_in(event: bytes) -> int:
    """The tokens one completions chunk carries: its logprobs entries (S1 asks logprobs 0)."""
    start = event.find(b'"token_logprobs":[')
    if start < 0:
        return 1
    end = event.find(b"]", start)
    return event.count(b",", start, end) + 1


async def _raw_load(base_url: str, payloads: list[dict], concurrency: int) -> list[dict]:
    host, port = base_url.removeprefix("http://").split(":")
    records = [{"times": [], "sizes": [], "sent": 0.0} for _ in payloads]
    queue = list(range(len(payloads)))[::-1]

    async def worker() -> None:
        while queue:
            index = queue.pop()
            records[index]["sent"] = time.perf_counter()
            body = json.dumps(payloads[index]).encode()
            await _raw_stream(host, int(port), body, records[index])

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return [
        {"ttft": r["times"][0] - r["sent"] if r["times"] else None, "start": r["sent"],
         "itl": [b - a for a, b in zip(r["times"], r["times"][1:])],
         "output_tokens": sum(r["sizes"]), "num_chunks": len(r["times"]), "ok": bool(r["times"])}
        for r in records
    ]


async def _bench_load(base_url: str, payloads: list[dict], concurrency: int) -> list[dict]:
    """ladle bench serve's path: run_point with the same HTTP client run_plan opens."""
    from ladle.bench import serve_run
    from ladle.bench.serve_client import BenchRequest
    from ladle.bench.serve_run import BenchPlan, run_point

    def open_http_client(plan):
        if hasattr(serve_run, "open_http_client"):
            return serve_run.open_http_client(plan)
        import httpx  # the same client as that tree's run_plan opened

        return httpx.AsyncClient(
            timeout=httpx.Timeout(plan.request_timeout, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
        )

    def open_stream_session(plan):
        if hasattr(serve_run, "open_stream_session"):
            return serve_run.open_stream_session(plan)
        return contextlib.nullcontext()

    plan = BenchPlan(
        base_url=base_url, model=None, api_key=None, tokenizer=None, mix={"S1": 1.0},
        num_prompts=len(payloads), points=[(float("inf"), concurrency)], burstiness=1.0, seed=0,
        temperature=0.6, ignore_eos=True, token_ids=True, input_len=(100, 1024),
        output_len=(100, 512), sharegpt_path=None, priority_fraction=None, slo={},
        gpu_hour_cost=None, output_dir=Path("/tmp"), label="served-path", plots=False,
        progress=False,
    )
    requests = []
    for body in payloads:
        extra = {k: v for k, v in body.items() if k not in (
            "model", "max_tokens", "temperature", "stream", "stream_options", "prompt")}
        requests.append(BenchRequest("S1", len(body["prompt"]), body["max_tokens"],
                                     prompt=body["prompt"], extra_body=extra))
    async with open_http_client(plan) as http, open_stream_session(plan) as streams:
        clients = (http, streams) if "streams" in inspect.signature(run_point).parameters else (
            http,)  # a tree from before the bench streamed through aiohttp (httpx alone)
        records, _, _ = await run_point(
            *clients, plan, payloads[0]["model"], requests, float("inf"), concurrency
        )
    return [
        {"ttft": r.ttft, "start": r.start, "itl": r.itl, "output_tokens": r.output_tokens,
         "num_chunks": getattr(r, "num_chunks", len(r.itl) + 1), "ok": r.success,
         "error": r.error}
        for r in records
    ]


def run_client(kind: str, base_url: str, concurrency: int, num_prompts: int, model: str) -> dict:
    from ladle.bench import serve_run

    run_event_loop = getattr(serve_run, "run_event_loop", asyncio.run)
    payloads = s1_payloads(num_prompts, model)
    load = _raw_load if kind == "raw" else _bench_load
    cpu, wall = time.process_time(), time.perf_counter()
    records = run_event_loop(load(base_url, payloads, concurrency))
    return {
        "client_cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - wall,
        "records": records,
    }


# ----- servers -----------------------------------------------------------------------------


class Server:
    """A fresh server process (and, for `api`, its paced engine process)."""

    def __init__(
        self, kind: str, step_ms: float, tokenizer: str | None, log_path: Path,
        profile: str | None = None, serve_args: str = "", gc_probe: bool = False,
    ) -> None:
        self.port = _free_port()
        self.log_path = log_path
        python = sys.executable
        if kind == "stub":
            command = [python, "-m", "ladle.bench.sse_stub_server", "--port", str(self.port),
                       "--step-ms", str(step_ms)]
        elif kind == "real":
            command = [python, "-m", "ladle", "serve", *serve_args.split()]
            command += ["--port", str(self.port)]
        else:
            command = [python, "-m", "ladle.bench.paced_serve", "--step-ms", str(step_ms)]
            if tokenizer is not None:
                command += ["--paced-tokenizer", tokenizer]
            if profile is not None:
                command += ["--profile", profile]
            if gc_probe:
                command += ["--gc-probe"]
            command += ["--", "qwen3-0.6b", "--load-format", "dummy", "--port", str(self.port)]
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.processes = {"stub" if kind == "stub" else "api": psutil.Process(self.process.pid)}

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: see {self.log_path}")
            try:
                answer = urllib.request.urlopen(self.base_url + "/v1/models", timeout=2).read()
                self.model = json.loads(answer)["data"][0]["id"]
                break
            except OSError:
                time.sleep(0.3)
        else:
            raise RuntimeError(f"the server was not ready in {timeout_s:.0f} s")
        match = ENGINE_PID_LINE.search(self.log_path.read_text())
        if match:
            self.processes["engine"] = psutil.Process(int(match.group(1)))

    def cpu_seconds(self) -> dict[str, float]:
        return {
            name: process.cpu_times().user + process.cpu_times().system
            for name, process in self.processes.items()
        }

    def stop(self) -> None:
        # SIGINT: uvicorn drains, then re-raises it as KeyboardInterrupt, which `ladle serve`
        # handles (a profile gets written); it re-raises SIGTERM as a plain kill.
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


class StepGaugeSampler(threading.Thread):
    """Reads `ladle:step_time_seconds` from the server's /metrics twice a second while a run
    goes (nothing from a server without it)."""

    def __init__(self, base_url: str) -> None:
        super().__init__(daemon=True)
        self.url = base_url + "/metrics"
        self.samples_ms: list[float] = []
        self.last_text = ""  # the last scrape, whole (its step-time histogram)
        self.first_text = ""  # the first, before the load: start-up's warm-up steps are in it
        self._done = threading.Event()

    def run(self) -> None:
        while True:
            self._scrape()
            if self._done.wait(0.5):
                self._scrape()  # the end of the run
                return

    def _scrape(self) -> None:
        try:
            text = urllib.request.urlopen(self.url, timeout=2).read().decode()
        except OSError:
            return
        self.last_text = text
        self.first_text = self.first_text or text
        for line in text.splitlines():
            if line.startswith("ladle:step_time_seconds"):
                value = float(line.split()[-1])
                if value > 0:
                    self.samples_ms.append(value * 1000)

    def __enter__(self) -> StepGaugeSampler:
        self._scrape()  # before the load: the baseline (start-up's steps)
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._done.set()
        self.join()


def _step_histogram(text: str) -> dict[str, int]:
    """{'<kind>_steps_le_<bound>': cumulative count} from ladle:step_duration_seconds."""
    counts = {}
    for line in text.splitlines():
        if line.startswith("ladle:step_duration_seconds_bucket"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            if bound in ("0.01", "0.02", "0.04", "0.08", "+Inf"):
                counts[f"{kind}_steps_le_{bound}"] = int(float(line.split()[-1]))
    return counts


ENGINE_ITL = "ladle:engine_inter_token_latency_seconds"


def _engine_itl(text: str) -> tuple[list[tuple[float, float]], float, float]:
    """([(upper bound s, cumulative count)...], sum s, count) of the engine-side inter-token
    histogram in a /metrics text; empty from a server without it."""
    buckets, total, count = [], 0.0, 0.0
    for line in text.splitlines():
        if line.startswith(ENGINE_ITL + "_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(bound), float(line.split()[-1])))
        elif line.startswith(ENGINE_ITL + "_sum"):
            total = float(line.split()[-1])
        elif line.startswith(ENGINE_ITL + "_count"):
            count = float(line.split()[-1])
    return buckets, total, count


def _histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket the rank falls in."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower_bound
            share = (rank - lower_count) / (cumulative - lower_count)
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, cumulative
    return None


def engine_itl_over_run(first_text: str, last_text: str) -> dict[str, float | None]:
    """The engine's token-weighted inter-token time over the run: the histogram of the last
    scrape less the first (before the load)."""
    first_buckets, first_sum, first_count = _engine_itl(first_text)
    buckets, total, count = _engine_itl(last_text)
    before = dict(first_buckets)
    run = [(bound, cumulative - before.get(bound, 0.0)) for bound, cumulative in buckets]
    tokens = count - first_count
    mean = (total - first_sum) / tokens if tokens > 0 else None
    p50 = _histogram_quantile(run, 0.5)
    return {
        "engine_itl_tokens": int(tokens),
        "engine_itl_ms_mean": None if mean is None else mean * 1000,
        "engine_itl_ms_p50": None if p50 is None else p50 * 1000,
    }


def _stalls(records: list[dict], min_gap_s: float = 0.03, window_s: float = 0.005) -> list:
    """Gaps over min_gap_s grouped by when they ended (within window_s of each other): a stall
    that every stream sees at once is the server's (a slow step or a blocked process); gaps
    spread over time, one stream each, are per stream. [[end s, streams, median gap ms]...]
    of the 12 largest groups, by streams."""
    ends = []
    for r in records:
        if r.get("start") is None or r["ttft"] is None:
            continue
        t = r["start"] + r["ttft"]
        for gap in r["itl"]:
            t += gap
            if gap > min_gap_s:
                ends.append((t, gap))
    ends.sort()
    groups: list[list[tuple[float, float]]] = []
    for end, gap in ends:
        if groups and end - groups[-1][-1][0] <= window_s:
            groups[-1].append((end, gap))
        else:
            groups.append([(end, gap)])
    origin = min((r["start"] for r in records if r.get("start") is not None), default=0.0)
    summary = [
        [round(group[0][0] - origin, 3), len(group),
         round(sorted(g for _, g in group)[len(group) // 2] * 1000, 1)]
        for group in groups
    ]
    return sorted(summary, key=lambda item: -item[1])[:12]


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _start_py_spy(
    py_spy: str | None, server: Server, log_dir: Path, concurrency: int
) -> list[subprocess.Popen]:
    """py-spy sampling each server process (collapsed stacks, without pausing it) for the run."""
    if py_spy is None:
        return []
    samplers = []
    for name, process in server.processes.items():
        output = log_dir / f"py_spy_{name}_{concurrency}.txt"
        samplers.append(subprocess.Popen(
            [py_spy, "record", "--pid", str(process.pid), "--rate", "200", "--nonblocking",
             "--format", "raw", "--output", str(output)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
    time.sleep(1.0)  # attached before the load starts
    return samplers


def _stop_py_spy(samplers: list[subprocess.Popen]) -> None:
    for sampler in samplers:
        sampler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    for sampler in samplers:
        try:
            sampler.wait(30)
        except subprocess.TimeoutExpired:
            sampler.kill()


def run_level(args: argparse.Namespace, concurrency: int, log_dir: Path) -> dict:
    server = Server(args.server, args.step_ms, args.paced_tokenizer,
                    log_dir / f"server_{args.server}_{concurrency}.log", args.profile_api,
                    args.serve_args, args.gc_probe)
    try:
        server.wait_ready()
        before = server.cpu_seconds()
        load_avg = os.getloadavg()[0]
        command = [sys.executable, __file__, "--role", "client", "--client", args.client,
                   "--base-url", server.base_url, "--concurrency", str(concurrency),
                   "--num-prompts", str(args.num_prompts), "--model", server.model]
        samplers = _start_py_spy(args.py_spy, server, log_dir, concurrency)
        try:
            with StepGaugeSampler(server.base_url) as step_gauge:
                done = subprocess.run(command, capture_output=True, text=True, check=True)
        finally:
            _stop_py_spy(samplers)
        after = server.cpu_seconds()
    finally:
        server.stop()
    client = json.loads(done.stdout.strip().splitlines()[-1])
    ok = [r for r in client["records"] if r["ok"]]
    tokens = sum(r["output_tokens"] for r in ok)
    itl_ms = [gap * 1000 for r in ok for gap in r["itl"]]
    cpu = {name: after[name] - before[name] for name in after}
    cpu["client"] = client["client_cpu_s"]
    wall = client["wall_s"]
    result = {
        "server": args.server,
        "client": args.client,
        "concurrency": concurrency,
        "step_ms": args.step_ms,
        "requests_ok": len(ok),
        "requests": len(client["records"]),
        "first_error": next((r.get("error") for r in client["records"] if not r["ok"]), None),
        "output_tokens": tokens,
        "tokens_per_chunk": round(tokens / max(1, sum(r["num_chunks"] for r in ok)), 2),
        "wall_s": round(wall, 2),
        "output_tok_per_s": round(tokens / wall),
        "ideal_tok_per_s": round(concurrency * 1000 / args.step_ms),
        "load_average_1m": round(load_avg, 2),
        "ttft_ms_p50": _round(_percentile([r["ttft"] * 1000 for r in ok if r["ttft"]], 50)),
        # Bunched: gaps under half a step are tokens of consecutive steps that arrived together.
        "itl_bunched_fraction": round(sum(g < args.step_ms / 2 for g in itl_ms) / len(itl_ms), 3)
        if itl_ms else None,
    }
    for q in (10, 50, 90, 99):
        result[f"itl_ms_p{q}"] = _round(_percentile(itl_ms, q))
    # The first wave's prompts are all prefilled at once at the start (a ramp of long mixed
    # steps); the requests sent later (as earlier ones finish) see the steady state.
    later = [r for r in client["records"][concurrency:] if r["ok"]]
    later_itl_ms = [gap * 1000 for r in later for gap in r["itl"]]
    for q in (50, 99):
        result[f"itl_ms_p{q}_after_first_wave"] = _round(_percentile(later_itl_ms, q))
    # TPOT: a request's first to last content event over its tokens after the first.
    tpot_ms = [
        sum(r["itl"]) * 1000 / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1
    ]
    result["tpot_ms_p50"] = _round(_percentile(tpot_ms, 50))
    # Item 6's comparison over the same window: every gap a client saw after a first token
    # against the engine's wait for the same tokens (ladle:engine_inter_token_latency_seconds:
    # each running stream's time since the engine loop sent its previous token). The means are
    # per token (total wait / tokens after the first), which a server merging steps into one
    # chunk does not change; the p50s are of what each side saw (the client's per chunk).
    client_gap_s = sum(sum(r["itl"]) for r in ok)
    client_tokens = sum(max(r["output_tokens"] - 1, 0) for r in ok)
    result["client_itl_tokens"] = client_tokens
    result["client_itl_ms_mean"] = _round(client_gap_s * 1000 / client_tokens) \
        if client_tokens else None
    engine = engine_itl_over_run(step_gauge.first_text, step_gauge.last_text)
    result.update({key: _round(value) if isinstance(value, float) else value
                   for key, value in engine.items()})
    for kind, client_ms in (("mean", result["client_itl_ms_mean"]), ("p50", result["itl_ms_p50"])):
        engine_ms = engine[f"engine_itl_ms_{kind}"]
        result[f"itl_{kind}_client_over_engine"] = (
            round(client_ms / engine_ms, 3) if client_ms and engine_ms else None
        )
    # The engine's own moving-average step time (`ladle serve`'s /metrics), sampled meanwhile.
    result["engine_step_gauge_ms_p50"] = _round(_percentile(step_gauge.samples_ms, 50))
    for line in step_gauge.last_text.splitlines():  # since start-up, warm-up included
        for kind in ("graph", "eager"):
            if line.startswith(f"ladle:{kind}_steps_total"):
                result[f"engine_{kind}_steps"] = int(float(line.split()[-1]))
    # The run's steps (the last scrape less the first, which holds start-up's warm-up steps) by
    # time: where the ITL tail can come from.
    start_counts = _step_histogram(step_gauge.first_text)
    for key, count in _step_histogram(step_gauge.last_text).items():
        result[f"engine_{key}"] = count - start_counts.get(key, 0)
    result["stalls"] = _stalls(ok)
    (log_dir / f"metrics_{concurrency}.txt").write_text(step_gauge.last_text)
    probe = GC_PROBE_LINE.search(server.log_path.read_text())
    if probe:
        result["api_gc_collections"] = json.loads(probe.group(1))
        result["api_gc_s"] = json.loads(probe.group(2))
        result["api_gc_longest_ms"] = float(probe.group(3))
    for name, seconds in cpu.items():
        result[f"{name}_cpu_s"] = round(seconds, 2)
        result[f"{name}_cpu_per_wall"] = round(seconds / wall, 2)
        result[f"{name}_us_per_token"] = round(seconds / max(tokens, 1) * 1e6, 1)
    return result


def comparison_line(result: dict) -> str:
    """Item 6 in one line: the client's inter-token times against the engine's."""
    return (
        f"{result['server']} x{result['concurrency']}: ITL mean client "
        f"{result['client_itl_ms_mean']} ms / engine {result['engine_itl_ms_mean']} ms = "
        f"{result['itl_mean_client_over_engine']}; p50 client {result['itl_ms_p50']} ms / engine "
        f"{result['engine_itl_ms_p50']} ms = {result['itl_p50_client_over_engine']}; tokens "
        f"{result['client_itl_tokens']} client, {result['engine_itl_tokens']} engine; "
        f"{result['tokens_per_chunk']} tokens/chunk, {result['output_tok_per_s']} tok/s"
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["run", "client"], default="run")
    parser.add_argument("--server", choices=["api", "stub", "real"], default="api")
    parser.add_argument("--client", choices=["bench", "raw"], default="bench")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[128, 256])
    parser.add_argument("--step-ms", type=float, default=7.0)
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument(
        "--paced-tokenizer", default=None,
        help="api server: the tokenizer to decode with, or 'none' (default: the default model's)",
    )
    parser.add_argument(
        "--serve-args", default="qwen3-0.6b --load-format dummy",
        help="real server: `ladle serve`'s arguments (default: S1's server)",
    )
    parser.add_argument("--profile-api", default=None, help="cProfile the API process (api server)")
    parser.add_argument(
        "--py-spy", default=None,
        help="a py-spy executable: sample each server process during the run (collapsed stacks "
        "in the log dir, py_spy_<process>_<concurrency>.txt)",
    )
    parser.add_argument(
        "--gc-probe", action="store_true",
        help="api server: time the API process's garbage collections (gc_* in the results)",
    )
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--log-dir", default="/tmp/served_path_bench")
    parser.add_argument("--json", default=None, help="append the results (a JSON line each)")
    args = parser.parse_args()
    if args.role == "client":
        result = run_client(
            args.client, args.base_url, args.concurrency[0], args.num_prompts, args.model
        )
        print(json.dumps(result))
        return
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    for concurrency in args.concurrency:
        result = run_level(args, concurrency, log_dir)
        print(json.dumps(result), flush=True)
        print(comparison_line(result), file=sys.stderr, flush=True)
        if args.json:
            with open(args.json, "a") as handle:
                handle.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
