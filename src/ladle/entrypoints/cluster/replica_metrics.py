"""Per-replica engine metrics on the endpoint's /metrics: every replica's own `ladle serve`
metrics (vllm:* and ladle:*), each sample labelled replica="<Ray replica id>", one HELP/TYPE
header per metric, so one Prometheus scrape of the endpoint sees every engine, and
`sum by (...)` gives the endpoint's totals (e.g. the aggregate prefix-cache hit rate:
sum(vllm:prefix_cache_hits_total) / sum(vllm:prefix_cache_queries_total)).

The replica ids are the same as in the router's `ladle_router_requests_total{replica=...}`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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
    families = _Families()
    for replica in sorted(texts):
        families.add(texts[replica], {REPLICA_LABEL: replica})
    return families.render()


def sum_metrics(texts: Iterable[bytes | str]) -> bytes:
    """Prometheus texts of processes with the same metrics (the front processes' router
    counters) -> one text, the samples with the same name and labels added up."""
    families = _Families()
    for text in texts:
        families.add(text, {}, add_up=True)
    return families.render()


class _Families:
    """Metric families gathered from several texts, rendered as one."""

    def __init__(self) -> None:
        self._headers: dict[str, tuple[str, str, str]] = {}  # family -> (exposed, type, help)
        # family -> {(sample name, labels): value}, in the order first seen
        self._samples: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}

    def add(self, text: bytes | str, extra_labels: dict[str, str], add_up: bool = False) -> None:
        if isinstance(text, bytes):
            text = text.decode()
        for family in text_string_to_metric_families(text):
            if family.name.endswith("_created"):
                continue
            exposed = family.name + "_total" if family.type == "counter" else family.name
            self._headers.setdefault(family.name, (exposed, family.type, family.documentation))
            samples = self._samples.setdefault(family.name, {})
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                labels = tuple({**extra_labels, **sample.labels}.items())
                key = (sample.name, labels)
                samples[key] = (samples.get(key, 0.0) if add_up else 0.0) + sample.value

    def render(self) -> bytes:
        out: list[str] = []
        for name, (exposed, kind, documentation) in self._headers.items():
            out.append(f"# HELP {exposed} {_escape(documentation)}")
            out.append(f"# TYPE {exposed} {kind}")
            for (sample_name, labels), value in self._samples[name].items():
                rendered = ",".join(f'{k}="{_escape(str(v))}"' for k, v in labels)
                braces = f"{{{rendered}}}" if rendered else ""
                out.append(f"{sample_name}{braces} {_format_value(value)}")
        return ("\n".join(out) + "\n").encode() if out else b""
