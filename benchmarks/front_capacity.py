"""How much the front of `ladle serve --replicas N` relays, measured without GPUs.

The front (entrypoints/cluster/front.py: a prefix key per request, one Ray slot call per
request, the replica's SSE bytes relayed to the client) runs exactly as `ladle serve` runs it,
in front of StubReplica deployments (stub_replica.py) that stream one token per stream per
"engine step" on Ray Serve. A closed-loop client keeps S streams open at a time; each level of S
offers S / step tokens per second. Per level this reports what reached the clients (output
tokens/s, TTFT and inter-token latency percentiles as the client sees them), and the CPU the
front's processes spent per relayed token, which depends little on what else the machine runs
(unlike wall-clock capacity: the load average is recorded with each level).

    python benchmarks/front_capacity.py --replicas 2 --streams 64,128,256 --step-ms 20 \\
        --output-tokens 128 --duration 20 --out /tmp/front.json [--api-server-count 2]

The front falls behind when the client's ITL p99 grows past a few steps, or the output tokens/s
stop following the offered load: that level's relayed tokens/s is the front's capacity there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

SERVING_LINE = re.compile(r"\[ladle\] serving .* on http://127\.0\.0\.1:(\d+)")


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=20.0, help="each stub engine's step")
    parser.add_argument(
        "--api-server-count",
        type=int,
        default=None,
        help="front processes (ladle serve's flag; default: its default)",
    )


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


class _Level:
    """What the clients saw at one level of streams in flight."""

    def __init__(self) -> None:
        self.ttft_s: list[float] = []
        self.itl_s: list[float] = []
        self.num_tokens = 0
        self.num_reads = 0  # reads that brought tokens: about the pieces the front wrote
        self.num_requests = 0
        self.num_errors = 0


async def _one_stream(http, url: str, body: bytes, level: _Level, measuring: list[bool]) -> None:
    sent = time.perf_counter()
    last = None
    pending = b""
    try:
        async with http.post(
            url, data=body, headers={"content-type": "application/json"}
        ) as answer:
            if answer.status != 200:
                level.num_errors += 1
                await answer.read()
                return
            while chunk := await answer.content.readany():
                now = time.perf_counter()
                pending += chunk
                *events, pending = pending.split(b"\n\n")
                if measuring[0]:
                    level.num_reads += 1
                for event in events:
                    if b'"text"' not in event and b'"content"' not in event:
                        continue  # the usage chunk, [DONE]
                    if measuring[0]:
                        level.num_tokens += 1
                        if last is None:
                            level.ttft_s.append(now - sent)
                        else:
                            level.itl_s.append(now - last)
                    last = now
    except Exception:  # noqa: BLE001 - a failed stream counts as an error, the run goes on
        level.num_errors += 1
        return
    if measuring[0]:
        level.num_requests += 1


async def _drive(
    port: int,
    num_streams: int,
    output_tokens: int,
    warmup_s: float,
    duration_s: float,
    window: _CpuWindow,
    seed: int,
) -> tuple[_Level, float]:
    """num_streams closed-loop clients for warmup_s + duration_s; returns the measured level
    and its measured seconds (the tokens that arrived within them)."""
    import aiohttp

    level = _Level()
    measuring = [False]
    rng = random.Random(seed)
    url = f"http://127.0.0.1:{port}/v1/completions"
    connector = aiohttp.TCPConnector(limit=0)
    deadline = time.perf_counter() + warmup_s + duration_s

    async def client(index: int) -> None:
        while time.perf_counter() < deadline:
            # 64 prompt ids, the first 16 shared by a quarter of the requests: prefix keys vary.
            prompt = [rng.randrange(4)] * 16 + [rng.randrange(50_000) for _ in range(48)]
            body = json.dumps(
                {
                    "model": "stub",
                    "prompt": prompt,
                    "max_tokens": output_tokens,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
            ).encode()
            await _one_stream(http, url, body, level, measuring)

    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as http:
        tasks = [asyncio.create_task(client(i)) for i in range(num_streams)]
        await asyncio.sleep(warmup_s)
        measuring[0] = True
        window.start()
        started = time.perf_counter()
        await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
        measured_s = time.perf_counter() - started
        window.end()
        measuring[0] = False
        await asyncio.gather(*tasks, return_exceptions=True)
    return level, measured_s


def _front_processes(root_pid: int) -> list:
    """The front's processes: the `ladle serve`-like root itself and its front workers (not Ray's
    processes, whose stub replicas stand in for the engines)."""
    import psutil

    from ladle.entrypoints.cluster.front_processes import find_front_workers

    return [psutil.Process(root_pid), *find_front_workers(root_pid)]


def _cpu_seconds(processes: list) -> list[float]:
    """Each process's CPU seconds (user + system) so far; 0 for one that is gone."""
    import psutil

    seconds = []
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            seconds.append(0.0)
            continue
        seconds.append(times.user + times.system)
    return seconds


class _CpuWindow:
    """Front CPU seconds between start() and end() (called from the client's loop), in all and
    per front process."""

    def __init__(self, processes: list) -> None:
        self._processes = processes
        self.cpu_s = 0.0
        self.cpu_s_by_process: list[float] = []
        self.load_average: tuple[float, ...] = ()
        self._started: list[float] = []

    def start(self) -> None:
        self._started = _cpu_seconds(self._processes)

    def end(self) -> None:
        ended = _cpu_seconds(self._processes)
        self.cpu_s_by_process = [after - before for after, before in zip(ended, self._started)]
        self.cpu_s = sum(self.cpu_s_by_process)
        self.load_average = os.getloadavg()


def _start_server(options: argparse.Namespace) -> tuple[subprocess.Popen, int, list[str]]:
    command = [
        sys.executable, str(Path(__file__).resolve()), "--serve",
        "--replicas", str(options.replicas), "--step-ms", str(options.step_ms),
    ]  # fmt: skip
    if options.api_server_count is not None:
        command += ["--api-server-count", str(options.api_server_count)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    lines: list[str] = []
    port: list[int] = []
    announced = threading.Event()

    def read() -> None:
        for line in process.stdout:
            lines.append(line)
            if match := SERVING_LINE.search(line):
                port.append(int(match.group(1)))
                announced.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + options.start_timeout
    while not announced.wait(0.2):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError("the stub cluster did not start:\n" + "".join(lines))
    return process, port[0], lines


def run_levels(options: argparse.Namespace) -> dict:
    server, port, lines = _start_server(options)
    report: dict = {
        "replicas": options.replicas,
        "step_ms": options.step_ms,
        "output_tokens": options.output_tokens,
        "api_server_count": options.api_server_count,
        "levels": [],
    }
    try:
        time.sleep(1.0)  # front workers that announce with the root settle
        processes = _front_processes(server.pid)
        report["num_front_processes"] = len(processes)
        for index, num_streams in enumerate(options.streams):
            window = _CpuWindow(processes)
            level, measured_s = asyncio.run(
                _drive(
                    port, num_streams, options.output_tokens, options.warmup,
                    options.duration, window, options.seed + index,
                )
            )  # fmt: skip
            offered = num_streams * 1000.0 / options.step_ms
            relayed = level.num_tokens / measured_s
            row = {
                "streams": num_streams,
                "offered_tok_s": round(offered),
                "relayed_tok_s": round(relayed),
                "requests": level.num_requests,
                "errors": level.num_errors,
                "front_cpu_cores": round(window.cpu_s / measured_s, 3),
                "front_cpu_cores_by_process": [
                    round(cpu_s / measured_s, 3) for cpu_s in window.cpu_s_by_process
                ],
                "front_cpu_us_per_token": round(1e6 * window.cpu_s / max(level.num_tokens, 1), 1),
                # The relay coalesces what a stream's replica wrote since its last read: per
                # piece is the cost that does not depend on how busy the front was.
                "tokens_per_piece": round(level.num_tokens / max(level.num_reads, 1), 2),
                "front_cpu_us_per_piece": round(1e6 * window.cpu_s / max(level.num_reads, 1), 1),
                "ttft_ms_p50": round(1e3 * _percentile(level.ttft_s, 0.50), 1),
                "ttft_ms_p99": round(1e3 * _percentile(level.ttft_s, 0.99), 1),
                "itl_ms_p50": round(1e3 * _percentile(level.itl_s, 0.50), 1),
                "itl_ms_p99": round(1e3 * _percentile(level.itl_s, 0.99), 1),
                "load_average_1m": round(window.load_average[0], 2),
            }
            report["levels"].append(row)
            print(f"[front] {json.dumps(row)}", flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
    report["server_log_tail"] = "".join(lines[-20:])
    return report


def serve_stub_cluster(options: argparse.Namespace) -> int:
    """The server side: a local Ray, the stub replicas, the front as `ladle serve` runs it."""
    import ray
    from ray import serve
    from stub_replica import build_stub_replicas

    from ladle.cli.cluster import (
        APP_NAME,
        api_server_count,
        serve_front_with_flags,
    )
    from ladle.entrypoints.cluster.front_server import bind_socket

    app, settings = build_stub_replicas(options.replicas, options.step_ms / 1000.0)
    ray.init(num_cpus=max(os.cpu_count() or 1, options.replicas + 1), include_dashboard=False)
    try:
        args = argparse.Namespace(
            host="127.0.0.1", log_level="warning", access_log=False, shutdown_timeout=5.0,
            request_timeout=60.0, keep_alive_timeout=5.0, max_connections=4096,
            replicas=options.replicas, max_replicas=None,
            api_server_count=options.api_server_count,
        )  # fmt: skip
        listener = bind_socket("127.0.0.1", 0, reuse_port=api_server_count(args) > 1)
        serve.start(http_options={"location": "NoServer"})
        serve.run(app, name=APP_NAME, route_prefix=None, blocking=False)
        return serve_front_with_flags(
            listener, settings, args, "stub", f"{options.replicas} stub replicas"
        )
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_server_arguments(parser)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--streams", default="32,64,128", help="levels of streams in flight")
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds a level")
    parser.add_argument("--start-timeout", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="write the report here (JSON)")
    options = parser.parse_args()
    if options.serve:
        return serve_stub_cluster(options)
    options.streams = [int(level) for level in options.streams.split(",")]
    report = run_levels(options)
    if options.out is not None:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
