"""The serving proofs of docs/benchmarks.md, each on vs off in the same run (issue 9, item 4).

    python scripts/serve_proofs.py --phase scheduler --out OUT   # chunked prefill, prefix
                                                                 # caching, priority (0.6B shape)
    python scripts/serve_proofs.py --phase slo --out OUT         # the SLO rate and SLO options
                                                                 # on vs off (8B shape)

Starts each `ladle serve` it needs (random weights of a real shape, 127.0.0.1, a free port),
drives it with `ladle bench serve`, stops it, and writes proofs.json plus every run's folder
(results.json and plots) under OUT.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

SERVING = re.compile(r"serving .* on http://127\.0\.0\.1:(\d+)")


class Server:
    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        command = [sys.executable, "-m", "ladle.cli", "serve", *args, "--port", "0"]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and self.process.poll() is None:
            match = SERVING.search(log_path.read_text())
            if match:
                self.url = f"http://127.0.0.1:{match.group(1)}"
                return
            time.sleep(0.5)
        raise RuntimeError(f"server did not start: {log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


EXTRA_BENCH_ARGS: list[str] = []
RATE = ["3"]  # the fixed rate of the chunked-prefill and prefix-caching runs (--rate)
SWEEP = ["1,2,4,8"]  # the short-chat rates of the SLO phase (--sweep)
LOAD_FORMAT = ["--load-format", "dummy"]


def bench(server: Server, out: Path, name: str, *args: str) -> dict:
    folder = out / name
    command = [
        sys.executable,
        "-m",
        "ladle.cli",
        "bench",
        "serve",
        "--base-url",
        server.url,
        "--token-ids",
        "--ignore-eos",
        "--disable-tqdm",
        "--output-dir",
        str(folder),
        "--label",
        name,
        *EXTRA_BENCH_ARGS,
        *args,
    ]
    started = time.monotonic()
    finished = subprocess.run(command, capture_output=True, text=True, timeout=400)
    (out / f"{name}.log").write_text(finished.stdout + finished.stderr)
    print(f"--- {name} ({time.monotonic() - started:.0f}s)\n{finished.stdout[-1500:]}", flush=True)
    if finished.returncode != 0:
        print(finished.stderr[-3000:], flush=True)
        return {}
    return json.loads((folder / "results.json").read_text())


def figure(
    result: dict,
    key: str,
    stat: str,
    run: int = 0,
    group: str | None = None,
    by: str = "by_workload",
):
    if not result:
        return None
    summary = result["runs"][run]
    summary = summary[by][group] if group is not None else summary["summary"]
    return summary[f"{key}_ms"][stat]


def scheduler_phase(model: str, out: Path, scale: float) -> dict:
    proofs: dict = {}
    num = max(8, int(64 * scale))
    common = [*LOAD_FORMAT, "--max-num-seqs", "32"]
    short = ["--input-len", "100:300", "--output-len", "64:128"]
    chunked = Server([model, *common, "--max-num-batched-tokens", "512"], out / "server_a.log")
    try:
        # Triton compiles a kernel per new shape on first use: pay for that before measuring.
        bench(
            chunked,
            out,
            "warmup",
            "--workload",
            "token-ids=4,shared-prefix=1",
            *short,
            "--num-prompts",
            "64",
            "--rate",
            "inf",
            "--no-plots",
            "--seed",
            "1000",
        )
        base = bench(
            chunked,
            out,
            "short_only",
            "--seed",
            "1",
            "--workload",
            "token-ids",
            *short,
            "--num-prompts",
            str(num),
            "--rate",
            "8",
        )
        mix = bench(
            chunked,
            out,
            "long_mix_chunked",
            "--seed",
            "2",
            "--workload",
            "token-ids=12,long-qa=1",
            *short,
            "--num-prompts",
            str(num),
            "--rate",
            "8",
        )
        prefix_on = bench(
            chunked,
            out,
            "prefix_on",
            "--seed",
            "3",
            "--workload",
            "shared-prefix",
            "--num-prompts",
            str(num),
            "--rate",
            "8",
        )
        saturation = bench(
            chunked,
            out,
            "saturation",
            "--seed",
            "4",
            "--workload",
            "token-ids",
            *short,
            "--num-prompts",
            str(2 * num),
            "--rate",
            "inf",
        )
        rate = 1.5 * saturation["runs"][0]["summary"]["request_throughput"] if saturation else 20
        rate = max(rate, 1.0)
        priority = bench(
            chunked,
            out,
            "priority",
            "--seed",
            "5",
            "--workload",
            "token-ids",
            *short,
            "--num-prompts",
            str(4 * num),
            "--rate",
            f"{rate:.2f}",
            "--priority-fraction",
            "0.5",
        )
    finally:
        chunked.stop()
    whole = Server(
        [model, *common, "--no-chunked-prefill", "--max-num-batched-tokens", "8448"],
        out / "server_b.log",
    )
    try:
        bench(
            whole,
            out,
            "warmup_b",
            "--workload",
            "token-ids=4,long-qa=1",
            *short,
            "--num-prompts",
            "32",
            "--rate",
            "inf",
            "--no-plots",
            "--seed",
            "1000",
        )
        mix_off = bench(
            whole,
            out,
            "long_mix_unchunked",
            "--seed",
            "2",
            "--workload",
            "token-ids=12,long-qa=1",
            *short,
            "--num-prompts",
            str(num),
            "--rate",
            "8",
        )
    finally:
        whole.stop()
    no_cache = Server(
        [model, *common, "--max-num-batched-tokens", "512", "--no-prefix-caching"],
        out / "server_c.log",
    )
    try:
        bench(
            no_cache,
            out,
            "warmup_c",
            "--workload",
            "token-ids",
            *short,
            "--num-prompts",
            "32",
            "--rate",
            "inf",
            "--no-plots",
            "--seed",
            "1000",
        )
        prefix_off = bench(
            no_cache,
            out,
            "prefix_off",
            "--seed",
            "3",
            "--workload",
            "shared-prefix",
            "--num-prompts",
            str(num),
            "--rate",
            "8",
        )
    finally:
        no_cache.stop()
    proofs["chunked_prefill"] = {
        "itl_p99_short_only_ms": figure(base, "itl", "p99"),
        "itl_p99_short_in_mix_chunked_ms": figure(mix, "itl", "p99", group="token-ids"),
        "itl_p99_short_in_mix_unchunked_ms": figure(mix_off, "itl", "p99", group="token-ids"),
    }
    records = prefix_on["runs"][0]["records"] if prefix_on else []
    # Every request after the first can hit the 1536-token prefix (96 full blocks of 16).
    expected = sum(1536 for r in records[1:]) / max(1, sum(r["prompt_tokens"] for r in records))
    proofs["prefix_caching"] = {
        "ttft_p50_on_ms": figure(prefix_on, "ttft", "p50"),
        "ttft_p50_off_ms": figure(prefix_off, "ttft", "p50"),
        "hit_rate_metrics": (prefix_on["runs"][0]["server_metrics"] or {}).get(
            "prefix_cache_hit_rate"
        )
        if prefix_on
        else None,
        "hit_rate_expected": expected,
    }
    proofs["priority"] = {
        "rate": rate,
        "ttft_p99_high_ms": figure(priority, "ttft", "p99", group="0", by="by_priority"),
        "ttft_p99_low_ms": figure(priority, "ttft", "p99", group="1", by="by_priority"),
    }
    return proofs


def slo_phase(model: str, out: Path, scale: float) -> dict:
    num = max(8, int(24 * scale))
    common = [model, *LOAD_FORMAT]
    plain = Server(common, out / "server_d.log")
    try:
        bench(
            plain,
            out,
            "warmup_d",
            "--workload",
            "sharegpt",
            "--num-prompts",
            "48",
            "--rate",
            "inf",
            "--no-plots",
            "--seed",
            "1000",
        )
        sweep = bench(
            plain,
            out,
            "short_chat_sweep",
            "--workload",
            "sharegpt",
            "--num-prompts",
            str(num),
            "--sweep",
            SWEEP[0],
            "--slo",
            "ttft=1s,itl=60ms",
        )
        saturation = sweep.get("saturation_request_throughput", 8.0) if sweep else 8.0
        saturation = max(saturation, 1.0)
        overload = f"{1.5 * saturation:.2f}"
        slo_off = bench(
            plain,
            out,
            "overload_slo_off",
            "--workload",
            "sharegpt",
            "--num-prompts",
            str(2 * num),
            "--rate",
            overload,
            "--slo",
            "ttft=1s,itl=60ms",
        )
    finally:
        plain.stop()
    with_slo = Server([*common, "--ttft-slo", "1s", "--itl-slo", "60ms"], out / "server_e.log")
    try:
        bench(
            with_slo,
            out,
            "warmup_e",
            "--workload",
            "sharegpt",
            "--num-prompts",
            "48",
            "--rate",
            "inf",
            "--no-plots",
            "--seed",
            "1000",
        )
        slo_on = bench(
            with_slo,
            out,
            "overload_slo_on",
            "--workload",
            "sharegpt",
            "--num-prompts",
            str(2 * num),
            "--rate",
            overload,
            "--slo",
            "ttft=1s,itl=60ms",
        )
    finally:
        with_slo.stop()
    passing = [
        run["rate"]
        for run in (sweep or {}).get("runs", [])
        if run["summary"]["ttft_ms"]["p99"] is not None
        and run["summary"]["ttft_ms"]["p99"] <= 1000
        and run["summary"]["itl_ms"]["p99"] <= 60
    ]
    return {
        "sweep": [
            {
                "rate": run["rate"],
                "throughput": run["summary"]["request_throughput"],
                "goodput": run["summary"]["goodput"],
                "ttft_p99_ms": run["summary"]["ttft_ms"]["p99"],
                "itl_p99_ms": run["summary"]["itl_ms"]["p99"],
            }
            for run in (sweep or {}).get("runs", [])
        ],
        "highest_rate_within_slo": max(passing, default=None),
        "saturation": saturation,
        "overload_rate": float(overload),
        "goodput_slo_off": slo_off["runs"][0]["summary"]["goodput"] if slo_off else None,
        "goodput_slo_on": slo_on["runs"][0]["summary"]["goodput"] if slo_on else None,
        "rate_limited_slo_on": (
            slo_on["runs"][0]["summary"]["num_rate_limited"] if slo_on else None
        ),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--phase", choices=["scheduler", "slo"], required=True)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the request counts")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--rate", default=RATE[0])
    parser.add_argument("--sweep", default=SWEEP[0])
    parser.add_argument("--bench-args", default="", help="extra `bench serve` options (smoke)")
    args = parser.parse_args()
    LOAD_FORMAT[1] = args.load_format
    RATE[0], SWEEP[0] = args.rate, args.sweep
    EXTRA_BENCH_ARGS.extend(args.bench_args.split())
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.phase == "scheduler":
        proofs = scheduler_phase(args.model or "qwen3-0.6b", out, args.scale)
    else:
        proofs = slo_phase(args.model or "llama-3.1-8b", out, args.scale)
    text = json.dumps(proofs, indent=1, default=lambda v: None if math.isinf(v) else v)
    (out / f"proofs_{args.phase}.json").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
