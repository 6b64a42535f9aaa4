"""Per-replica engine metrics on the endpoint's /metrics, without Ray: two replicas' real
`ladle serve` metrics merge into one valid Prometheus text where every sample carries its replica
label, values are the replicas' own, and each metric has one HELP/TYPE header."""

from prometheus_client.parser import text_string_to_metric_families

from ladle.entrypoints.cluster.replica_metrics import merge_replica_metrics
from ladle.frontend.metrics import ServerMetrics
from ladle.protocol.messages import SchedulerStats


def _replica(prompt_tokens: int, hits: int, queries: int) -> bytes:
    metrics = ServerMetrics("m")
    metrics.record_accepted(prompt_tokens, 1)
    metrics.record_engine_stats(
        SchedulerStats(prefix_cache_hits=hits, prefix_cache_queries=queries)
    )
    return metrics.render()


def test_every_sample_is_labelled_by_its_replica():
    merged = merge_replica_metrics({"r1": _replica(10, 5, 20), "r0": _replica(7, 30, 40)})
    text = merged.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    prompt = {s.labels["replica"]: s.value for s in families["vllm:prompt_tokens"].samples}
    assert prompt == {"r0": 7.0, "r1": 10.0}
    hits = {s.labels["replica"]: s.value for s in families["vllm:prefix_cache_hits"].samples}
    queries = {s.labels["replica"]: s.value for s in families["vllm:prefix_cache_queries"].samples}
    assert hits == {"r0": 30.0, "r1": 5.0} and queries == {"r0": 40.0, "r1": 20.0}
    # The endpoint's aggregate hit rate is the sums' ratio, as a Prometheus query would form it.
    assert sum(hits.values()) / sum(queries.values()) == 35 / 60
    # Histograms keep their buckets, per replica, with the model label beside the replica's.
    buckets = [
        s
        for s in families["vllm:time_to_first_token_seconds"].samples
        if s.name.endswith("_bucket")
    ]
    assert {s.labels["replica"] for s in buckets} == {"r0", "r1"}
    assert all(s.labels["model_name"] == "m" for s in buckets)
    # One header per metric, whatever the number of replicas; no per-process *_created series.
    assert text.count("# TYPE vllm:prompt_tokens_total counter") == 1
    assert "_created" not in text


def test_no_replicas_no_text():
    assert merge_replica_metrics({}) == b""
