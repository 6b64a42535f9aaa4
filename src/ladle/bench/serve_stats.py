"""Per-request records of a serving benchmark and the summary made of them.

Every figure of the summary is recomputed from the records alone (tests check that), so a JSON
file of records is enough to re-derive, re-plot or re-judge a run against another SLO:

- TTFT: request sent -> first content chunk; ITL: the gaps between content chunks (a chunk that
  carries several tokens is one gap, as vLLM's bench counts it; chunks that arrived in one read
  are gaps of 0); TPOT: (e2e - TTFT) / (output tokens - 1); e2e: sent -> last byte.
- Tokens per chunk: output tokens / content chunks; above 1 where the server merged steps.
- Goodput: successful requests per second of the run that meet every bound of the SLO.
- Cost per million output tokens: the hardware's hourly price times the run's wall time.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from ladle.cli.durations import parse_duration

PERCENTILES = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft", "itl", "tpot", "e2e")
SLO_KEYS = ("ttft", "itl", "tpot", "e2e")


@dataclass
class RequestRecord:
    """What one request did, as the client saw it. Times are seconds."""

    index: int
    workload: str
    scheduled_start: float  # when the arrival process released it, relative to the run start
    start: float = 0.0  # when it was sent (after any --max-concurrency wait)
    prompt_tokens: int = 0  # the server's usage count when it sent one, else the expected length
    output_tokens: int = 0
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    num_chunks: int = 0  # content chunks received (one more than the ITL gaps)
    e2e: float | None = None
    status: int | None = None  # HTTP status; None when the connection itself failed
    error: str | None = None
    priority: int = 0

    @property
    def success(self) -> bool:
        return self.error is None and self.status == 200 and self.ttft is not None

    @property
    def tpot(self) -> float | None:
        if not self.success or self.output_tokens < 2 or self.e2e is None:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def to_json(self) -> dict:
        data = asdict(self)
        data["tpot"] = self.tpot
        data["success"] = self.success
        return data


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=500ms,itl=50ms' -> {'ttft': 0.5, 'itl': 0.05}. Keys: ttft, itl (a request's p99
    inter-token gap), tpot, e2e."""
    if not text:
        return {}
    slo = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise ValueError(
                f"bad SLO term {part!r}; write key=duration with key one of {', '.join(SLO_KEYS)}"
            )
        slo[key] = parse_duration(value)
    return slo


def request_itl_p99(record: RequestRecord) -> float | None:
    return float(np.percentile(record.itl, 99)) if record.itl else None


def meets_slo(record: RequestRecord, slo: dict[str, float]) -> bool:
    """A successful request all of whose measured figures are within their bounds."""
    if not record.success:
        return False
    measured = {
        "ttft": record.ttft,
        "itl": request_itl_p99(record),
        "tpot": record.tpot,
        "e2e": record.e2e,
    }
    # A request with one output token has no gap: no ITL or TPOT to break.
    return all(measured[key] is None or measured[key] <= bound for key, bound in slo.items())


def latency_summary(values: list[float]) -> dict[str, float | None]:
    """Mean and percentiles in milliseconds (numpy's linear interpolation); None when empty."""
    keys = ["mean", *(f"p{p}" for p in PERCENTILES)]
    if not values:
        return dict.fromkeys(keys)
    array = np.asarray(values, dtype=np.float64) * 1000.0
    summary = {"mean": float(array.mean())}
    for p in PERCENTILES:
        summary[f"p{p}"] = float(np.percentile(array, p))
    return summary


def latency_samples(records: list[RequestRecord], metric: str) -> list[float]:
    """Seconds: one value per successful request (ttft, tpot, e2e) or one per gap (itl)."""
    ok = [r for r in records if r.success]
    if metric == "itl":
        return [gap for r in ok for gap in r.itl]
    if metric == "tpot":
        return [r.tpot for r in ok if r.tpot is not None]
    return [getattr(r, metric) for r in ok if getattr(r, metric) is not None]


def summarize(
    records: list[RequestRecord],
    duration_s: float,
    slo: dict[str, float],
    gpu_hour_cost: float | None,
) -> dict:
    """The run's figures, all derived from the records and the run's wall time."""
    ok = [r for r in records if r.success]
    num_errors = len(records) - len(ok)
    num_429 = sum(1 for r in records if r.status == 429)
    output_tokens = sum(r.output_tokens for r in ok)
    num_chunks = sum(r.num_chunks for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    duration = max(duration_s, 1e-9)
    num_good = sum(1 for r in ok if meets_slo(r, slo))
    summary = {
        "num_requests": len(records),
        "num_completed": len(ok),
        "num_errors": num_errors,
        "num_rate_limited": num_429,
        "error_rate": num_errors / len(records) if records else 0.0,
        "rate_limited_rate": num_429 / len(records) if records else 0.0,
        "duration_s": duration_s,
        "total_prompt_tokens": prompt_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": output_tokens / duration,
        "tokens_per_chunk": output_tokens / num_chunks if num_chunks else None,
        "total_token_throughput": (prompt_tokens + output_tokens) / duration,
        "slo": {key: value * 1000.0 for key, value in slo.items()},  # milliseconds
        "num_good": num_good,
        "goodput": num_good / duration,
        "cost_per_million_output_tokens": (
            gpu_hour_cost * duration_s / 3600.0 / output_tokens * 1e6
            if gpu_hour_cost is not None and output_tokens
            else None
        ),
        "errors": _error_counts(records),
        # What a failing run most needs to say (a 400's message names the field).
        "first_error": next(
            (record.error for record in records if not record.success and record.error), None
        ),
    }
    for metric in LATENCY_METRICS:
        summary[f"{metric}_ms"] = latency_summary(latency_samples(records, metric))
    return summary


def _error_counts(records: list[RequestRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for record in records:
        if record.success:
            continue
        key = str(record.status) if record.status is not None else "connection"
        counts[key] = counts.get(key, 0) + 1
    return counts


def format_summary(summary: dict, label: str) -> str:
    """A readable block for the terminal."""
    lines = [f"==== {label} ===="]
    lines.append(
        f"requests: {summary['num_completed']}/{summary['num_requests']} ok, "
        f"errors {summary['num_errors']} ({summary['error_rate']:.1%}), "
        f"429 {summary['num_rate_limited']} ({summary['rate_limited_rate']:.1%}), "
        f"in {summary['duration_s']:.2f}s"
    )
    if summary.get("first_error"):
        lines.append(f"first error: {summary['first_error']}")
    lines.append(
        f"throughput: {summary['request_throughput']:.2f} req/s, "
        f"{summary['output_throughput']:.1f} output tok/s, "
        f"{summary['total_token_throughput']:.1f} total tok/s"
        + (
            f", {summary['tokens_per_chunk']:.2f} tokens per chunk"
            if summary.get("tokens_per_chunk")
            else ""
        )
    )
    if summary["slo"]:
        terms = ", ".join(f"{k}<={v:g}ms" for k, v in summary["slo"].items())
        lines.append(
            f"goodput ({terms}): {summary['goodput']:.2f} req/s "
            f"({summary['num_good']}/{summary['num_requests']} requests)"
        )
    if summary["cost_per_million_output_tokens"] is not None:
        lines.append(f"cost: ${summary['cost_per_million_output_tokens']:.4f} per 1M output tokens")
    for metric in LATENCY_METRICS:
        figures = summary[f"{metric}_ms"]
        if figures["mean"] is None:
            continue
        shown = "  ".join(
            f"{k} {v:8.1f}" for k, v in figures.items() if v is not None and math.isfinite(v)
        )
        lines.append(f"{metric.upper():>5} ms  {shown}")
    return "\n".join(lines)
