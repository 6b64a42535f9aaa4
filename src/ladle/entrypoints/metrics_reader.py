"""LLM.get_metrics(): the engine's counters as vLLM's offline metrics reader gives them
(`vllm.v1.metrics.reader`): a list of Counter / Gauge / Vector / Histogram, each with the
Prometheus name `ladle serve`'s /metrics uses, without the `_total` suffix, and its labels.

vLLM's speculative decoding example reads acceptance this way, and so does the same code here:

    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            assert isinstance(metric, Vector)
            per_position = metric.values
"""

from __future__ import annotations

from collections import Counter as _Tally
from dataclasses import dataclass, field

from ladle.outputs import RequestOutput
from ladle.protocol.messages import SchedulerStats


@dataclass
class Metric:
    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int | float


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Vector(Metric):
    """A counter per position (vLLM's accepted tokens per draft position)."""

    values: list[int]


@dataclass
class Histogram(Metric):
    count: int
    sum: float
    # upper bound (as text, "+Inf" last) -> observations at or below it, cumulative
    buckets: dict[str, int]


@dataclass
class OfflineTotals:
    """What the API process counts when serving (prompt and generated tokens, finished
    sequences by reason), counted by LLM for its finished requests."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: _Tally = field(default_factory=_Tally)

    def record_finished(self, output: RequestOutput) -> None:
        self.prompt_tokens += len(output.prompt_token_ids or ())
        for completion in output.outputs:
            self.generation_tokens += len(completion.token_ids)
            self.finished[completion.finish_reason or "abort"] += 1


def metrics_snapshot(stats: SchedulerStats, totals: OfflineTotals) -> list[Metric]:
    """The metrics of one engine, labelled as vLLM labels them offline (engine "0")."""
    labels = {"engine": "0"}
    metrics: list[Metric] = [
        Gauge("vllm:num_requests_running", labels, stats.num_running_reqs),
        Gauge("vllm:num_requests_waiting", labels, stats.num_waiting_reqs),
        Gauge("vllm:kv_cache_usage_perc", labels, stats.kv_cache_usage),
        Counter("vllm:prefix_cache_queries", labels, stats.prefix_cache_queries),
        Counter("vllm:prefix_cache_hits", labels, stats.prefix_cache_hits),
        Counter("vllm:num_preemptions", labels, stats.num_preemptions),
        Counter("vllm:prompt_tokens", labels, totals.prompt_tokens),
        Counter("vllm:generation_tokens", labels, totals.generation_tokens),
    ]
    metrics += [
        Counter("vllm:request_success", {**labels, "finished_reason": reason}, count)
        for reason, count in sorted(totals.finished.items())
    ]
    spec = stats.spec_decode
    if spec is not None:
        metrics += [
            Counter("vllm:spec_decode_num_drafts", labels, spec.num_drafts),
            Counter("vllm:spec_decode_num_draft_tokens", labels, spec.num_draft_tokens),
            Counter("vllm:spec_decode_num_accepted_tokens", labels, spec.num_accepted_tokens),
            Vector(
                "vllm:spec_decode_num_accepted_tokens_per_pos", labels,
                list(spec.num_accepted_tokens_per_pos),
            ),
        ]
    return metrics
