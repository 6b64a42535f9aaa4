"""Per-replica engine metrics on the endpoint's /metrics: every replica's own `ladle serve`
metrics (vllm:* and ladle:*), each sample labelled replica="<Ray replica id>", one HELP/TYPE
header per metric, so one Prometheus scrape of the endpoint sees every engine, and
`sum by (...)` gives the endpoint's totals (e.g. the aggregate prefix-cache hit rate:
sum(vllm:prefix_cache_hits_total) / sum(vllm:prefix_cache_queries_total)).

The replica ids are the same as in the router's `ladle_router_requests_total{replica=...}`.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

REPLICA_LABEL = "replica"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _format_value(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    return repr(float(value))


def merge_replica_metrics(texts: Mapping[str, bytes | str]) -> bytes:
    """{replica id: that replica's Prometheus text} -> one text, every sample labelled by its
    replica. Families keep the order they first appear in; `*_created` timestamps are dropped
    (per-process bookkeeping that means nothing across replicas)."""
    headers: dict[str, tuple[str, str, str]] = {}  # family -> (exposed name, type, help)
    samples: dict[str, list[str]] = {}
    for replica in sorted(texts):
        text = texts[replica]
        if isinstance(text, bytes):
            text = text.decode()
        for family in text_string_to_metric_families(text):
            if family.name.endswith("_created"):
                continue
            exposed = family.name + "_total" if family.type == "counter" else family.name
            headers.setdefault(family.name, (exposed, family.type, family.documentation))
            lines = samples.setdefault(family.name, [])
            for sample in family.samples:
                labels = {REPLICA_LABEL: replica, **sample.labels}
                rendered = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels.items())
                lines.append(f"{sample.name}{{{rendered}}} {_format_value(sample.value)}")
    out: list[str] = []
    for name, (exposed, kind, documentation) in headers.items():
        out.append(f"# HELP {exposed} {_escape(documentation)}")
        out.append(f"# TYPE {exposed} {kind}")
        out.extend(samples[name])
    return ("\n".join(out) + "\n").encode() if out else b""
