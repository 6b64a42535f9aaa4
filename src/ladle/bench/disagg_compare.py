"""`ladle bench serve --compare-disaggregation | --compare-replicas --serve-args "MODEL [flags]"`.

Runs the same workload (the same seeds, rates and SLOs) against two servers it starts in turn,
each behind ladle's own front on this machine. --compare-disaggregation:
- `ladle serve MODEL ... --disaggregate 1P1D` (a prefill and a decode engine, one GPU each);
- `ladle serve MODEL ... --local-replicas 2` (two aggregated engines, one GPU each);
and prints, per load point, goodput under --slo, request and output throughput, TTFT p99 and
ITL p99 for both, with which mode wins. --compare-replicas (the scale-out check): two replicas
(`--local-replicas 2`) against one (`ladle serve MODEL ...`), and how many times one replica's
output throughput two give, per load point and at the TTFT p99 bound of --slo (the best
throughput of each whose TTFT p99 stays within it; target 1.8x). Each mode's full results.json
and plots go to its own folder under --output-dir; compare.json holds the table.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from ladle.bench.serve_run import run_event_loop, run_plan

SERVING_LINE = re.compile(r"\[ladle\] serving .* on (http://[^ ]+?) ")
MODES = (
    ("disaggregated 1P1D", "1p1d", ["--disaggregate", "1P1D"]),
    ("2 aggregated replicas", "2replicas", ["--local-replicas", "2"]),
)
REPLICA_MODES = (
    ("2 replicas", "2replicas", ["--local-replicas", "2"]),
    ("1 replica", "1replica", []),
)
# Issue 13's target: two replicas give at least this many times one replica's throughput.
SCALING_TARGET = 1.8
STARTUP_TIMEOUT_S = 1800.0


class _Server:
    """`ladle serve ARGS --port 0` in a subprocess; start() returns its base URL."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.args = args
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self._url: str | None = None
        self._ready = threading.Event()

    def start(self) -> str:
        command = [sys.executable, "-m", "ladle.cli", "serve", *self.args, "--port", "0"]
        print(f"[bench] starting: {shlex.join(command)}", file=sys.stderr, flush=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self._ready.wait(0.5):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not start; its log: {self.log_path}")
        return self._url

    def _read(self) -> None:
        with open(self.log_path, "w") as log:
            for line in self.process.stdout:
                log.write(line)
                log.flush()
                if (match := SERVING_LINE.search(line)) and not self._ready.is_set():
                    self._url = match.group(1)
                    self._ready.set()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def _row(mode: str, run: dict) -> dict:
    summary = run["summary"]
    return {
        "mode": mode,
        "rate": run.get("rate"),
        "max_concurrency": run.get("max_concurrency"),
        "goodput": summary["goodput"],
        "request_throughput": summary["request_throughput"],
        "output_throughput": summary["output_throughput"],
        "ttft_p99_ms": (summary.get("ttft_ms") or {}).get("p99"),
        "itl_p99_ms": (summary.get("itl_ms") or {}).get("p99"),
        "num_errors": summary["num_errors"],
    }


def run_comparison(plan, serve_args: str, disaggregate_args: str = "",
                   replicas: bool = False) -> int:
    """Run `plan` (a BenchPlan; its base_url is ignored) against both modes: 1P1D and two
    replicas, or (replicas) two replicas and one."""
    flag = "--compare-replicas" if replicas else "--compare-disaggregation"
    if not serve_args:
        raise ValueError(
            f"{flag} starts the servers itself: give --serve-args "
            "\"MODEL [engine flags]\" (the flags both modes share)"
        )
    rows = []
    for mode, slug, flags in REPLICA_MODES if replicas else MODES:
        if slug == "1p1d":
            flags = [*flags, *shlex.split(disaggregate_args or "")]
        server = _Server([*shlex.split(serve_args), *flags],
                         plan.output_dir / slug / "server.log")
        try:
            url = server.start()
            mode_plan = dataclasses.replace(
                plan, base_url=url, output_dir=plan.output_dir / slug, label=f"{plan.label} "
                f"({mode})"
            )
            result = run_event_loop(run_plan(mode_plan))
        finally:
            server.stop()
        if result is None:
            print(f"[bench] {mode}: nothing ran", file=sys.stderr)
            return 1
        rows += [_row(mode, run) for run in result["runs"]]
    _print_table(rows, plan.slo)
    report = {"slo_s": plan.slo, "rows": rows}
    if replicas:
        report["scaling"] = replica_scaling(rows, plan.slo.get("ttft"))
        _print_scaling(report["scaling"])
    (plan.output_dir / "compare.json").write_text(json.dumps(report, indent=2))
    print(f"comparison: {plan.output_dir / 'compare.json'}")
    return 0


def replica_scaling(rows: list[dict], ttft_bound_s: float | None) -> dict:
    """Two replicas' output throughput over one's: per load point, and at the TTFT p99 bound
    (each mode's best throughput among the points whose TTFT p99 is within it; every point
    without a bound)."""
    two = [row for row in rows if row["mode"] == REPLICA_MODES[0][0]]
    one = [row for row in rows if row["mode"] == REPLICA_MODES[1][0]]

    def within(row: dict) -> bool:
        p99 = row["ttft_p99_ms"]
        return ttft_bound_s is None or (p99 is not None and p99 <= ttft_bound_s * 1000)

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    points = [
        {"rate": a["rate"], "max_concurrency": a["max_concurrency"],
         "ratio": ratio(a["output_throughput"], b["output_throughput"]),
         "ttft_p99_ms": [a["ttft_p99_ms"], b["ttft_p99_ms"]]}
        for a in two for b in one
        if (a["rate"], a["max_concurrency"]) == (b["rate"], b["max_concurrency"])
    ]
    best_two = max((r["output_throughput"] for r in two if within(r)), default=0.0)
    best_one = max((r["output_throughput"] for r in one if within(r)), default=0.0)
    at_bound = ratio(best_two, best_one)
    return {
        "points": points,
        "ttft_p99_bound_ms": ttft_bound_s * 1000 if ttft_bound_s is not None else None,
        "best_output_throughput": {"2 replicas": best_two, "1 replica": best_one},
        "ratio_at_bound": at_bound,
        "target": SCALING_TARGET,
        "meets_target": at_bound is not None and at_bound >= SCALING_TARGET,
    }


def _print_scaling(scaling: dict) -> None:
    for point in scaling["points"]:
        ratio = point["ratio"]
        print(f"rate {point['rate']}, concurrency {point['max_concurrency']}: 2 replicas give "
              f"{'-' if ratio is None else f'{ratio:.2f}x'} one replica's output throughput "
              f"(TTFT p99 {point['ttft_p99_ms'][0]} vs {point['ttft_p99_ms'][1]} ms)")
    bound = scaling["ttft_p99_bound_ms"]
    ratio = scaling["ratio_at_bound"]
    print(f"at TTFT p99 <= {'any' if bound is None else f'{bound:.0f} ms'}: "
          f"{'-' if ratio is None else f'{ratio:.2f}x'} (target {scaling['target']}x: "
          f"{'met' if scaling['meets_target'] else 'not met'})")


def _print_table(rows: list[dict], slo: dict) -> None:
    terms = ", ".join(f"{key} <= {value * 1000:.0f} ms" for key, value in slo.items()) or "none"
    print(f"goodput under SLO ({terms})")
    header = f"{'mode':24} {'rate':>6} {'conc':>5} {'goodput':>9} {'req/s':>8} {'out tok/s':>10} " \
        f"{'TTFT p99':>9} {'ITL p99':>8}"
    print(header)
    for row in rows:
        def ms(value):
            return f"{value:9.1f}" if value is not None else f"{'-':>9}"
        print(f"{row['mode']:24} {row['rate']!s:>6} {row['max_concurrency']!s:>5} "
              f"{row['goodput']:9.2f} {row['request_throughput']:8.2f} "
              f"{row['output_throughput']:10.1f} {ms(row['ttft_p99_ms'])} {ms(row['itl_p99_ms'])}")
    points = {}
    for row in rows:
        points.setdefault((row["rate"], row["max_concurrency"]), []).append(row)
    for (rate, concurrency), pair in points.items():
        if len(pair) == 2:
            best = max(pair, key=lambda r: r["goodput"])
            other = min(pair, key=lambda r: r["goodput"])
            ratio = best["goodput"] / other["goodput"] if other["goodput"] else float("inf")
            print(f"rate {rate}, concurrency {concurrency}: {best['mode']} wins "
                  f"({ratio:.2f}x the goodput)")
