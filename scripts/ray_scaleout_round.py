"""Scale-out proof (issue 13): one `ladle serve` against `ladle serve --replicas N` on Ray Serve,
under the same load per replica, in one process run (one device call on a 2-GPU machine).

Each phase starts its server, warms it up with a short run (first-use kernel compiles), then runs
`ladle bench serve` closed-loop at `--concurrency` requests in flight per replica: enough to keep
one replica's batch full, so a single replica is saturated and its TTFT p99 is the bound the
replicated endpoint must hold while it serves N times the load. Writes scaleout.json (both
summaries and the ratio) and each run's results.json under --out.

    python3 scripts/ray_scaleout_round.py --out /tmp/scaleout -- llama-3.1-8b --load-format dummy
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

SERVING_LINE = re.compile(r"\[ladle\] serving .* on http://127\.0\.0\.1:(\d+)")


class Server:
    """`python -m ladle.cli serve ARGS --port 0` (a free port), its output kept in a log file."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str]) -> None:
        self.log_path = log_path
        self.port: int | None = None
        self._announced = threading.Event()
        command = [sys.executable, "-m", "ladle.cli", "serve", *args, "--port", "0"]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        threading.Thread(target=self._read_output, daemon=True).start()

    def _read_output(self) -> None:
        with self.log_path.open("w") as log:
            for line in self.process.stdout:
                log.write(line)
                log.flush()
                if match := SERVING_LINE.search(line):
                    self.port = int(match.group(1))
                    self._announced.set()

    def wait_ready(self, timeout_s: float) -> float:
        started = time.monotonic()
        deadline = started + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            if self._announced.wait(0.2) and _health_ok(self.port):
                return time.monotonic() - started
        raise RuntimeError(f"server not ready in {timeout_s}s; log: {self.log_path}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def _process_role(process) -> str:
    """Which part of the serving stack a process is, from its command line (Ray names its
    actors' processes ray::<class>)."""
    command = " ".join(process.cmdline())
    for marker, role in (
        ("LadleIngress", "ingress replica"),
        ("ProxyActor", "Ray Serve proxy"),
        ("LadleReplica", "engine replica (API)"),
        ("ServeController", "Ray Serve controller"),
        ("spawn_main", "engine core"),
        # --api-server-count K: the front processes after the first (children of ladle serve)
        ("front_worker", "front processes after the first"),
        ("ladle.cli serve", "ladle serve process"),
        ("raylet", "Ray (raylet, GCS, workers)"),
        ("gcs_server", "Ray (raylet, GCS, workers)"),
    ):
        if marker in command:
            return role
    return "other"


def _cpu_seconds_by_role(root_pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of every process under root_pid, summed by role."""
    import psutil

    totals: dict[str, float] = {}
    try:
        root = psutil.Process(root_pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return totals
    for process in processes:
        try:
            times = process.cpu_times()
            role = _process_role(process)
        except psutil.Error:  # exited while we looked
            continue
        totals[role] = totals.get(role, 0.0) + times.user + times.system
    return totals


def _health_ok(port: int | None) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            body = answer.read()
    except OSError:
        return False
    # One server answers an empty 200; the replicated endpoint's body says whether all run.
    try:
        return not body or json.loads(body).get("status") == "ok"
    except ValueError:
        return False


def _bench(
    port: int,
    options: argparse.Namespace,
    num_prompts: int,
    concurrency: int,
    out: Path,
    label: str,
    env: dict[str, str],
) -> dict:
    command = [
        sys.executable,
        "-m",
        "ladle.cli",
        "bench",
        "serve",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--workload",
        "token-ids",
        "--token-ids",
        "--input-len",
        options.input_len,
        "--output-len",
        options.output_len,
        "--ignore-eos",
        "--rate",
        "inf",
        "--max-concurrency",
        str(concurrency),
        "--num-prompts",
        str(num_prompts),
        "--seed",
        str(options.seed),
        "--no-plots",
        "--disable-tqdm",
        "--output-dir",
        str(out / label),
        "--label",
        label,
    ]
    subprocess.run(command, check=True, env=env, timeout=options.bench_timeout)
    result = json.loads((out / label / "results.json").read_text())
    summary = result["runs"][0]["summary"]
    return {
        key: summary[key]
        for key in (
            "num_requests",
            "num_completed",
            "num_errors",
            "duration_s",
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
            "ttft_ms",
            "itl_ms",
            "e2e_ms",
        )
    }


def _phase(
    name: str,
    serve_args: list[str],
    num_replicas: int,
    options: argparse.Namespace,
    out: Path,
    env: dict[str, str],
) -> dict:
    server = Server(serve_args, out / f"{name}_server.log", env)
    try:
        ready_s = server.wait_ready(options.start_timeout)
        print(f"[round] {name}: ready in {ready_s:.1f}s on port {server.port}", flush=True)
        _bench(
            server.port,
            options,
            options.warmup_prompts * num_replicas,
            options.concurrency * num_replicas,
            out,
            f"{name}_warmup",
            env,
        )
        cpu_before = _cpu_seconds_by_role(server.process.pid)
        summary = _bench(
            server.port,
            options,
            options.num_prompts * num_replicas,
            options.concurrency * num_replicas,
            out,
            name,
            env,
        )
        cpu_after = _cpu_seconds_by_role(server.process.pid)
        # Where the time went during the measured run: each role's CPU seconds per second.
        summary["cpu_cores_by_role"] = {
            role: round((cpu_after[role] - cpu_before.get(role, 0.0)) / summary["duration_s"], 3)
            for role in sorted(cpu_after)
        }
        if num_replicas > 1:
            # The whole front: the ladle serve process (the first front, Ray's driver threads
            # with it) and any further front processes; per output token, the figure
            # `python benchmarks/front_capacity.py` measures against stub replicas.
            front_s = sum(
                cpu_after.get(role, 0.0) - cpu_before.get(role, 0.0)
                for role in ("ladle serve process", "front processes after the first")
            )
            output_tokens = summary["output_throughput"] * summary["duration_s"]
            summary["front_cpu_cores"] = round(front_s / summary["duration_s"], 3)
            summary["front_cpu_us_per_token"] = (
                round(1e6 * front_s / output_tokens, 1) if output_tokens else None
            )
        summary["ready_s"] = ready_s
        print(f"[round] {name}: {json.dumps(summary)}", flush=True)
        return summary
    finally:
        server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=128, help="in flight per replica")
    parser.add_argument("--num-prompts", type=int, default=512, help="measured, per replica")
    parser.add_argument("--warmup-prompts", type=int, default=64, help="per replica")
    parser.add_argument("--input-len", default="64:256")
    parser.add_argument("--output-len", default="64:128")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-timeout", type=float, default=240.0)
    parser.add_argument("--bench-timeout", type=float, default=300.0)
    parser.add_argument(
        "--api-server-count",
        type=int,
        default=None,
        help="front processes of the replicated phase (default: ladle serve's default)",
    )
    parser.add_argument(
        "--replicated-only",
        action="store_true",
        help="skip the one-server phase (its figure comes from an earlier call on the same kind)",
    )
    parser.add_argument("serve_args", nargs="*", help="after --: model and `ladle serve` flags")
    options = parser.parse_args()
    options.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    single_env = dict(env)
    if "CUDA_VISIBLE_DEVICES" not in env:
        single_env["CUDA_VISIBLE_DEVICES"] = "0"  # ignored without GPUs
    single = (
        None
        if options.replicated_only
        else _phase("single", options.serve_args, 1, options, options.out, single_env)
    )
    count = options.api_server_count
    fronts = [] if count is None else ["--api-server-count", str(count)]
    replicated = _phase(
        f"replicas{options.replicas}",
        [*options.serve_args, "--replicas", str(options.replicas), *fronts],
        options.replicas,
        options,
        options.out,
        env,
    )
    if single is None:
        return 0
    ratio = replicated["output_throughput"] / single["output_throughput"]
    report = {
        "serve_args": options.serve_args,
        "replicas": options.replicas,
        "concurrency_per_replica": options.concurrency,
        "input_len": options.input_len,
        "output_len": options.output_len,
        "single": single,
        "replicated": replicated,
        "throughput_ratio": ratio,
        "ttft_p99_ms": [single["ttft_ms"]["p99"], replicated["ttft_ms"]["p99"]],
    }
    (options.out / "scaleout.json").write_text(json.dumps(report, indent=1))
    print(
        f"[round] output throughput x{ratio:.2f}; TTFT p99 single "
        f"{single['ttft_ms']['p99']:.0f} ms, replicated {replicated['ttft_ms']['p99']:.0f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
