"""Reads a server's Prometheus `/metrics` before, during and after a benchmark run.

Series are found under vLLM's names (`vllm:...`, which ladle also exports) and ladle's own
(`ladle:...`), so the same report works against vLLM. A server without /metrics gives None.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name -> value over all label sets (replicas, models, reasons).

    Counts add up across label sets; a fraction (a `_perc` gauge such as KV usage) is averaged,
    since two replicas each 60% full are 60% full, not 120%.
    """
    values: dict[str, float] = {}
    label_sets: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
            label_sets[sample.name] = label_sets.get(sample.name, 0) + 1
    for name, count in label_sets.items():
        if name.endswith("_perc"):
            values[name] /= count
    return values


async def scrape(http: httpx.AsyncClient, base_url: str) -> dict[str, float] | None:
    try:
        response = await http.get(base_url + "/metrics", timeout=10)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return parse_metrics(response.text)
    except ValueError:
        return None


@dataclass
class MetricsPoller:
    """Samples queue depth and KV usage every interval_s while a run goes."""

    http: httpx.AsyncClient
    base_url: str
    interval_s: float = 1.0
    samples: list[dict[str, float]] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            values = await scrape(self.http, self.base_url)
            if values is not None:
                self.samples.append(values)
            await asyncio.sleep(self.interval_s)


def _delta(before: dict, after: dict, name: str) -> float | None:
    if name not in after:
        return None
    return after[name] - before.get(name, 0.0)


def _sum_prefix(values: dict, prefix: str) -> float:
    return sum(v for k, v in values.items() if k.startswith(prefix))


def server_report(
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    samples: list[dict[str, float]],
) -> dict | None:
    """What the server says happened during the run (None when it has no /metrics)."""
    if before is None or after is None:
        return None
    queries = _delta(before, after, "vllm:prefix_cache_queries_total")
    hits = _delta(before, after, "vllm:prefix_cache_hits_total")
    waiting = [s["vllm:num_requests_waiting"] for s in samples if "vllm:num_requests_waiting" in s]
    kv = [s["vllm:kv_cache_usage_perc"] for s in samples if "vllm:kv_cache_usage_perc" in s]
    rejected = _sum_prefix(after, "ladle:requests_rejected_total") - _sum_prefix(
        before, "ladle:requests_rejected_total"
    )
    return {
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": hits / queries if queries else None,
        "preemptions": _delta(before, after, "vllm:num_preemptions_total"),
        "rejections": rejected,
        "queue_depth_max": max(waiting) if waiting else None,
        "queue_depth_mean": sum(waiting) / len(waiting) if waiting else None,
        "kv_cache_usage_max": max(kv) if kv else None,
        "kv_cache_usage_mean": sum(kv) / len(kv) if kv else None,
        "num_samples": len(samples),
        **_speculation_report(before, after),
    }


def _speculation_report(before: dict[str, float], after: dict[str, float]) -> dict:
    """Acceptance during the run, when the server speculates (its spec_decode counters)."""
    if "vllm:spec_decode_num_drafts_total" not in after:
        return {}
    drafts = _delta(before, after, "vllm:spec_decode_num_drafts_total") or 0
    drafted = _delta(before, after, "vllm:spec_decode_num_draft_tokens_total") or 0
    accepted = _delta(before, after, "vllm:spec_decode_num_accepted_tokens_total") or 0
    return {
        "spec_decode_num_drafts": drafts,
        "spec_decode_num_draft_tokens": drafted,
        "spec_decode_num_accepted_tokens": accepted,
        "spec_decode_acceptance_length": 1 + accepted / drafts if drafts else None,
        "spec_decode_acceptance_rate": accepted / drafted if drafted else None,
    }
