"""Per-engine gauges of a multi-engine front (`--disaggregate xPyD`): each engine by its role
("prefill 0", "decode 2"), up or down, with its own requests and KV pool, so that an operator
sees which engine is down or full behind the combined vllm: gauges."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ladle.protocol.messages import SchedulerStats

# (role, alive, sequences routed to it since the server started, the latest stats of its
# current process or None before its first step)
InstanceView = tuple[str, bool, int, SchedulerStats | None]


class InstanceStatsCollector(Collector):
    """Exports, at scrape time, what view() returns."""

    def __init__(self, model_name: str, view: Callable[[], list[InstanceView]]) -> None:
        self.model_name = model_name
        self.view = view

    def collect(self) -> Iterator:
        labels = ["model_name", "engine"]
        families = {
            "up": GaugeMetricFamily("ladle:engine_up", "1 while this engine process serves.",
                                    labels=labels),
            "running": GaugeMetricFamily("ladle:engine_requests_running",
                                         "Sequences running on this engine.", labels=labels),
            "free": GaugeMetricFamily("ladle:engine_kv_free_blocks",
                                      "Free KV blocks of this engine's pool.", labels=labels),
            "total": GaugeMetricFamily("ladle:engine_kv_total_blocks",
                                       "KV blocks of this engine's pool.", labels=labels),
        }
        routed = CounterMetricFamily(
            "ladle:engine_requests_routed", "Sequences sent to this engine (a split prompt "
            "counts on its prefill and its decode engine).", labels=labels,
        )
        for role, alive, num_routed, stats in self.view():
            values = [self.model_name, role]
            families["up"].add_metric(values, 1.0 if alive else 0.0)
            routed.add_metric(values, num_routed)
            if stats is not None:
                families["running"].add_metric(values, stats.num_running_reqs)
                families["free"].add_metric(values, stats.num_free_blocks)
                families["total"].add_metric(values, stats.num_total_blocks)
        yield from families.values()
        yield routed
