"""The on-vs-off plots of the serving proofs, drawn from a `scripts/serve_proofs.py` output folder.

    python scripts/serve_proofs_plots.py OUT docs/plots

chunked_prefill.png  ITL CDF of the short requests: alone, among long prompts chunked, unchunked
prefix_caching.png   TTFT CDF of the shared-prefix workload, caching on vs off
priority.png         TTFT CDF of the high- and low-priority halves under overload
slo_goodput.png      goodput, completed and refused requests under overload, SLO options on/off
peer_sweep.png       ladle vs `transformers serve --continuous-batching` on the short-chat sweep
                     (ladle alone when the peer did not run)
stalls.png           every inter-token gap against time, scheduler-phase runs in order
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def _records(out: Path, name: str, run: int = 0) -> list[dict]:
    path = out / name / "results.json"
    if not path.exists():
        return []
    return json.loads(path.read_text())["runs"][run]["records"]


def _cdf(axis, values_s: list[float], label: str) -> None:
    values = np.sort(np.asarray(values_s, dtype=float) * 1000.0)
    if values.size:
        axis.plot(values, np.arange(1, values.size + 1) / values.size, label=label)


def _ok(records: list[dict], **match) -> list[dict]:
    return [r for r in records if r["success"] and all(r.get(k) == v for k, v in match.items())]


def _finish(figure, axis, xlabel: str, title: str, path: Path) -> None:
    axis.set_xlabel(xlabel)
    axis.set_ylabel("fraction")
    axis.set_xscale("log")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)


def chunked_prefill(out: Path, target: Path) -> bool:
    figure, axis = plt.subplots(figsize=(6.4, 4))
    found = False
    for name, label in (
        ("short_only", "short requests alone"),
        ("long_mix_chunked", "among 4k-8k prompts, chunked (512)"),
        ("long_mix_unchunked", "among 4k-8k prompts, unchunked"),
    ):
        gaps = [g for r in _ok(_records(out, name), workload="token-ids") for g in r["itl"]]
        found |= bool(gaps)
        _cdf(axis, gaps, label)
    _finish(figure, axis, "inter-token gap (ms)", "ITL of short requests", target)
    return found


def prefix_caching(out: Path, target: Path) -> bool:
    figure, axis = plt.subplots(figsize=(6.4, 4))
    found = False
    for name, label in (("prefix_on", "prefix caching on"), ("prefix_off", "off")):
        ttft = [r["ttft"] for r in _ok(_records(out, name))]
        found |= bool(ttft)
        _cdf(axis, ttft, label)
    _finish(figure, axis, "TTFT (ms)", "shared 1536-token prefix", target)
    return found


def priority(out: Path, target: Path) -> bool:
    records = _records(out, "priority")
    figure, axis = plt.subplots(figsize=(6.4, 4))
    for level, label in ((0, "high priority (0)"), (1, "low priority (1)")):
        _cdf(axis, [r["ttft"] for r in _ok(records, priority=level)], label)
    _finish(figure, axis, "TTFT (ms)", "half the requests high priority, 1.5x saturation", target)
    return bool(records)


def slo_goodput(proofs: dict, target: Path) -> bool:
    off, on = proofs.get("slo_off"), proofs.get("slo_on")
    if not off or not on:
        return False
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    names = ["SLO options off", "--ttft-slo 1s --itl-slo 60ms"]
    axes[0].bar(names, [off["goodput"], on["goodput"]], color=["tab:gray", "tab:green"])
    axes[0].set_ylabel("goodput (req/s within TTFT 1 s, ITL 60 ms)")
    width = 0.35
    x = np.arange(2)
    for shift, key, label in (
        (-width / 2, "num_good", "within SLO"),
        (width / 2, "num_rate_limited", "refused (429)"),
    ):
        axes[1].bar(x + shift, [off[key], on[key]], width, label=label)
    axes[1].set_xticks(x, names)
    axes[1].set_ylabel("requests")
    axes[1].legend()
    figure.suptitle(f"8B shape, short chat at {proofs['overload_rate']:g} req/s (1.5x saturation)")
    figure.tight_layout()
    figure.savefig(target, dpi=80)
    plt.close(figure)
    return True


def peer_sweep(proofs: dict, target: Path) -> bool:
    series = {"ladle": proofs.get("sweep") or [], "transformers serve": []}
    series["transformers serve"] = (proofs.get("peer") or {}).get("sweep") or []
    if not series["ladle"]:
        return False
    figure, axes = plt.subplots(1, 3, figsize=(14, 4))
    for name, rows in series.items():
        rows = [row for row in rows if isinstance(row["rate"], int | float)]
        rows = [row for row in rows if not math.isinf(row["rate"])]
        rates = [row["rate"] for row in rows]
        axes[0].plot(rates, [row["output_throughput"] for row in rows], "o-", label=name)
        axes[1].plot(rates, [row["ttft_p99_ms"] or np.nan for row in rows], "o-", label=name)
        axes[2].plot(rates, [row["itl_p99_ms"] or np.nan for row in rows], "o-", label=name)
    axes[1].axhline(1000, color="red", linestyle="--", label="SLO 1 s")
    axes[2].axhline(60, color="red", linestyle="--", label="SLO 60 ms")
    for axis, label in zip(axes, ("output tok/s", "TTFT p99 (ms)", "ITL p99 (ms)")):
        axis.set_xlabel("offered rate (req/s, Poisson)")
        axis.set_ylabel(label)
        axis.grid(True, alpha=0.3)
        axis.legend()
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    figure.suptitle("Llama-3.1-8B shape (random weights), short chat, one H100")
    figure.tight_layout()
    figure.savefig(target, dpi=80)
    plt.close(figure)
    return True


def stalls(out: Path, target: Path) -> bool:
    """Every inter-token gap against the time it ended, for runs in the order they ran: the
    server-wide pauses show as columns of equal gaps across all running requests."""
    names = [n for n in ("short_only", "long_mix_chunked", "prefix_on", "saturation", "priority")
             if _records(out, n)]  # fmt: skip
    if not names:
        return False
    figure, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.4), sharey=True)
    for axis, name in zip(np.atleast_1d(axes), names):
        times, gaps = [], []
        for record in _ok(_records(out, name)):
            clock = record["start"] + record["ttft"]
            for gap in record["itl"]:
                clock += gap
                times.append(clock)
                gaps.append(gap * 1000.0)
        axis.scatter(times, gaps, s=3)
        axis.set_yscale("log")
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("time in run (s)")
        axis.grid(True, which="both", alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("inter-token gap (ms)")
    figure.suptitle("0.6B shape, one server, runs in order: every gap of every request")
    figure.tight_layout()
    figure.savefig(target, dpi=80)
    plt.close(figure)
    return True


def main() -> int:
    out, target = Path(sys.argv[1]), Path(sys.argv[2])
    target.mkdir(parents=True, exist_ok=True)
    proofs = json.loads((out / "proofs.json").read_text())
    slo = proofs.get("slo") or {}
    drawn = {
        "chunked_prefill": chunked_prefill(out, target / "serve_chunked_prefill.png"),
        "prefix_caching": prefix_caching(out, target / "serve_prefix_caching.png"),
        "priority": priority(out, target / "serve_priority.png"),
        "slo_goodput": slo_goodput(slo, target / "serve_slo_goodput.png"),
        "peer_sweep": peer_sweep(slo, target / "serve_peer_sweep.png"),
        "stalls": stalls(out, target / "serve_stalls.png"),
    }
    print(drawn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
