"""PNG plots of a serving benchmark (matplotlib, no display needed).

latency_cdf.png   CDFs of TTFT, ITL and e2e latency, one line per rate of the sweep
throughput.png    request throughput and goodput against the offered rate
p99.png           TTFT and ITL p99 against the offered rate
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ladle.bench.serve_stats import RequestRecord, latency_samples


def _pyplot():
    # matplotlib is optional (the `bench` extra) and its backend must be chosen before pyplot
    # is imported.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _rate_label(rate: float, concurrency: int | None) -> str:
    label = "inf" if math.isinf(rate) else f"{rate:g}/s"
    return label if concurrency is None else f"{label}, {concurrency} in flight"


def _rate_x(runs: list[dict]) -> tuple[list[float], list[str]]:
    """Finite rates as they are; inf (and concurrency-only sweeps) as evenly spaced ticks."""
    labels = [_rate_label(run["rate"], run["max_concurrency"]) for run in runs]
    return list(range(len(runs))), labels


def plot_runs(
    runs: list[dict], records_by_run: list[list[RequestRecord]], folder: Path, title: str
) -> list[str]:
    """Write the plots of a sweep to folder; returns the file paths."""
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    written = []

    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    plotted = False
    for run, records in zip(runs, records_by_run):
        label = _rate_label(run["rate"], run["max_concurrency"])
        for axis, metric in zip(axes, ("ttft", "itl", "e2e")):
            values = np.sort(np.asarray(latency_samples(records, metric)) * 1000.0)
            if values.size and values.min() > 0:
                axis.plot(values, np.arange(1, values.size + 1) / values.size, label=label)
                plotted = True
    for axis, metric in zip(axes, ("TTFT", "ITL", "e2e latency")):
        axis.set_xlabel(f"{metric} (ms)")
        axis.set_ylabel("fraction of requests" if metric != "ITL" else "fraction of gaps")
        if plotted:  # a run where every request failed has nothing to draw
            axis.set_xscale("log")
        axis.grid(True, which="both", alpha=0.3)
    if plotted:
        axes[0].legend(fontsize=8)
    figure.suptitle(f"{title}: latency CDFs")
    figure.tight_layout()
    written.append(_save(figure, folder / "latency_cdf.png", plt))

    x, labels = _rate_x(runs)
    figure, axis = plt.subplots(figsize=(7, 4.2))
    axis.plot(x, [r["summary"]["request_throughput"] for r in runs], "o-", label="throughput")
    if any(r["summary"]["slo"] for r in runs):
        axis.plot(x, [r["summary"]["goodput"] for r in runs], "s-", label="goodput (SLO met)")
    axis.set_xticks(x, labels, rotation=30, ha="right")
    axis.set_xlabel("offered load")
    axis.set_ylabel("requests / s")
    axis.grid(True, alpha=0.3)
    axis.legend()
    axis.set_title(f"{title}: throughput and goodput")
    figure.tight_layout()
    written.append(_save(figure, folder / "throughput.png", plt))

    figure, axis = plt.subplots(figsize=(7, 4.2))
    any_value = False
    for metric in ("ttft", "itl"):
        values = [r["summary"][f"{metric}_ms"]["p99"] or np.nan for r in runs]
        any_value = any_value or any(v > 0 for v in values if not np.isnan(v))
        axis.plot(x, values, "o-", label=f"{metric.upper()} p99")
    axis.set_xticks(x, labels, rotation=30, ha="right")
    axis.set_xlabel("offered load")
    axis.set_ylabel("ms")
    if any_value:
        axis.set_yscale("log")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    axis.set_title(f"{title}: p99 latency")
    figure.tight_layout()
    written.append(_save(figure, folder / "p99.png", plt))
    return written


def _save(figure, path: Path, plt) -> str:
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return str(path)
