"""Prometheus metrics of the server, under vLLM's names where vLLM has one.

Dashboards and alerts written for vLLM work unchanged, so every metric vLLM also exports keeps
its `vllm:` name, label (`model_name`) and meaning (`vllm:kv_cache_usage_perc` is a fraction in
[0, 1], as in vLLM). Metrics vLLM does not have are prefixed `ladle:`. Counters get the `_total`
suffix from prometheus-client, as vLLM's do.

Two sources feed them:
- the engine core's SchedulerStats snapshot (running / waiting counts, KV usage, prefix-cache
  and preemption totals), exported by a collector at scrape time, so a scrape always shows the
  latest snapshot and the engine's cumulative counters need no delta bookkeeping;
- the API process's view of each request (tokens, TTFT, inter-token and end-to-end latency).

Each ServerMetrics has its own registry: two servers in one process (tests) never collide.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ladle.engine.token_gap_meter import ENGINE_ITL_BOUNDS_S
from ladle.outputs import RequestOutput
from ladle.protocol.messages import STEP_TIME_BOUNDS_S, SchedulerStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets, so histograms from the two engines can be compared bucket by bucket.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                       5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
# vLLM's 1-2-5 series for token counts.
TOKEN_COUNT_BUCKETS = tuple(m * 10**e for e in range(7) for m in (1, 2, 5))
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


class _EngineStatsCollector(Collector):
    """Exports the latest SchedulerStats snapshot at scrape time."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.stats = SchedulerStats()
        self.engine_alive = True

    def collect(self) -> Iterator:
        labels = ["model_name"]
        values = [self.model_name]
        stats = self.stats

        def gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, documentation, labels=labels)
            family.add_metric(values, value)
            return family

        def counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, documentation, labels=labels)
            family.add_metric(values, value)
            return family

        yield gauge("vllm:num_requests_running", "Sequences in the running batch.",
                    stats.num_running_reqs)
        yield gauge("vllm:num_requests_waiting", "Sequences waiting to be scheduled.",
                    stats.num_waiting_reqs)
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0 to 1).",
                    stats.kv_cache_usage)
        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                      stats.prefix_cache_queries)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                      stats.prefix_cache_hits)
        yield counter("vllm:num_preemptions", "Preemptions (by recompute) since start.",
                      stats.num_preemptions)
        hit_rate = (
            stats.prefix_cache_hits / stats.prefix_cache_queries
            if stats.prefix_cache_queries else 0.0
        )
        yield gauge("ladle:prefix_cache_hit_rate",
                    "Prefix-cache hits / queries (tokens) since start.", hit_rate)
        yield gauge("ladle:kv_cache_free_blocks", "KV cache blocks free (cached ones included).",
                    stats.num_free_blocks)
        yield gauge("ladle:kv_cache_total_blocks", "KV cache blocks in the pool.",
                    stats.num_total_blocks)
        yield gauge("ladle:engine_alive", "1 while the engine-core process is alive.",
                    1.0 if self.engine_alive else 0.0)
        yield gauge("ladle:prefill_tokens_per_second",
                    "Measured prompt tokens per second of the steps that computed some (moving "
                    "average; what the TTFT-SLO admission predicts with).",
                    stats.prefill_tokens_per_s)
        yield gauge("ladle:step_time_seconds", "Moving average of the engine step time.",
                    stats.mean_step_time_s)
        yield counter("ladle:prefill_tokens", "Prompt tokens computed (recomputes included).",
                      stats.num_prefill_tokens)
        yield counter("ladle:decode_tokens", "Tokens computed by decode steps.",
                      stats.num_decode_tokens)
        step_time = HistogramMetricFamily(
            "ladle:step_duration_seconds",
            "Engine step wall time, steps with prompt tokens (kind=prefill, mixed steps "
            "included) and decode-only steps (kind=decode).",
            labels=["model_name", "kind"],
        )
        for kind, counts, seconds in (
            ("prefill", stats.prefill_step_counts, stats.prefill_step_seconds),
            ("decode", stats.decode_step_counts, stats.decode_step_seconds),
        ):
            counts = counts or (0,) * (len(STEP_TIME_BOUNDS_S) + 1)
            cumulative, buckets = 0, []
            for bound, count in zip((*map(str, STEP_TIME_BOUNDS_S), "+Inf"), counts):
                cumulative += count
                buckets.append((bound, cumulative))
            step_time.add_metric([self.model_name, kind], buckets, seconds)
        yield step_time
        yield _histogram(
            "ladle:engine_inter_token_latency_seconds",
            "Time a running stream waited for each token at the engine: since the engine sent "
            "its previous token (the engine loop's cycles; 0 for extra tokens of one output). "
            "The inter-token latency a client would see if the API process added nothing.",
            labels, values, ENGINE_ITL_BOUNDS_S, stats.engine_itl_counts,
            stats.engine_itl_seconds,
        )
        yield from _host_tier_metrics(stats, gauge, counter)
        yield from _disaggregation_metrics(stats, gauge, counter)
        yield counter("ladle:graph_steps", "Engine steps replayed from a CUDA graph.",
                      stats.num_graph_steps)
        yield from _expert_load(self.model_name, stats.expert_token_counts)
        yield counter("ladle:eager_steps", "Engine steps whose model ran eagerly (all of them "
                      "on the CPU and under --enforce-eager).", stats.num_eager_steps)
        if stats.spec_decode is not None:
            yield from _spec_decode_metrics(stats.spec_decode, labels, values, counter)


def _spec_decode_metrics(spec, labels, values, counter) -> Iterator:
    """Speculative decoding (only while it is on): vLLM's four counters, the acceptance-length
    histogram and the host time spent drafting."""
    yield counter("vllm:spec_decode_num_drafts", "Request steps that verified drafts.",
                  spec.num_drafts)
    yield counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.",
                  spec.num_draft_tokens)
    yield counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                  spec.num_accepted_tokens)
    per_position = CounterMetricFamily(
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "Draft tokens accepted, by their position in the draft (0: the first).",
        labels=[*labels, "position"],
    )
    for position, count in enumerate(spec.num_accepted_tokens_per_pos):
        per_position.add_metric([*values, str(position)], count)
    yield per_position
    # Tokens each drafted request step emitted: 1 + its accepted drafts, in 1 .. k + 1.
    counts = tuple(spec.acceptance_length_counts)
    lengths = tuple(float(length) for length in range(1, len(counts) + 1))
    total = sum((index + 1) * count for index, count in enumerate(counts))
    yield _histogram(
        "ladle:spec_decode_acceptance_length",
        "Tokens emitted per request step that verified drafts (accepted drafts + 1).",
        labels, values, lengths[:-1], counts, float(total),
    )
    yield counter("ladle:spec_decode_drafting_seconds",
                  "Host time the proposers took to draft.", spec.drafting_seconds)


def _disaggregation_metrics(stats: SchedulerStats, gauge, counter) -> Iterator:
    """Prefill/decode disaggregation (core/kv_handoff.py): a consumer's pulls and a producer's
    holds; zeros on an engine that is neither. vLLM's counterparts are its NIXL connector's
    (vllm:nixl_xfer_time_seconds, vllm:nixl_bytes_transferred, vllm:nixl_num_failed_transfers,
    vllm:nixl_num_kv_expired_reqs); ladle's transfer is not NIXL, so its names are its own."""
    yield counter("ladle:kv_pulls", "KV pulls from a prefill instance that completed.",
                  stats.num_kv_pulls)
    yield counter("ladle:kv_pull_blocks", "KV blocks pulled from prefill instances.",
                  stats.num_kv_pull_blocks)
    yield counter("ladle:kv_pull_bytes", "KV bytes pulled from prefill instances.",
                  stats.kv_pull_bytes)
    yield counter("ladle:kv_pull_seconds",
                  "Time the pulls took (host wall time; on CUDA the time to issue the copies).",
                  stats.kv_pull_seconds)
    yield counter("ladle:kv_pulls_failed",
                  "KV pulls that failed (producer gone, bad pool): the prompt was computed "
                  "here instead.", stats.num_kv_pulls_failed)
    yield counter("ladle:kv_pulls_too_late",
                  "Handoffs that reached the decode scheduler too close to their hold's expiry: "
                  "the prompt was computed here instead of pulled.", stats.num_kv_pulls_too_late)
    yield counter("ladle:kv_handoffs", "Prompts a prefill instance handed off to a decode "
                  "instance (KV held until pulled).", stats.num_kv_handoffs)
    yield gauge("ladle:kv_handoffs_held", "Handed-off prompts whose KV is held now.",
                stats.num_kv_handoffs_held)
    yield gauge("ladle:kv_handoff_blocks_held", "KV blocks held for decode instances now.",
                stats.num_kv_handoff_blocks_held)
    yield counter("ladle:kv_handoffs_expired",
                  "Holds freed unpulled after the hold timeout (vllm:nixl_num_kv_expired_reqs).",
                  stats.num_kv_handoffs_expired)


def _host_tier_metrics(stats: SchedulerStats, gauge, counter) -> Iterator:
    """The KV cache's host tier (core/host_tier.py): vLLM's external-prefix-cache and
    KV-offload names where it has them, zeros when the tier is off."""
    yield counter("vllm:external_prefix_cache_queries",
                  "Prompt tokens looked up in the host tier (those after the device hits).",
                  stats.host_cache_queries)
    yield counter("vllm:external_prefix_cache_hits", "Prompt tokens found in the host tier.",
                  stats.host_cache_hits)
    yield counter("ladle:kv_offload_misses",
                  "Prompt tokens looked up in the host tier and not found there.",
                  stats.host_cache_queries - stats.host_cache_hits)
    # vLLM v0's name for its CPU (swap) pool's usage.
    yield gauge("vllm:cpu_cache_usage_perc",
                "Fraction of the host tier's blocks a copy is using now (0 to 1; returns to 0 "
                "when idle, like vllm:kv_cache_usage_perc).", stats.host_kv_usage)
    yield gauge("ladle:kv_offload_cached_blocks", "Host-tier blocks holding a prefix's KV.",
                stats.num_host_cached_blocks)
    yield gauge("ladle:kv_offload_total_blocks", "Blocks in the host tier (0: off).",
                stats.num_host_blocks)
    yield counter("ladle:kv_offload_bytes_to_host", "KV bytes copied device -> host.",
                  stats.kv_bytes_to_host)
    yield counter("ladle:kv_offload_bytes_to_device", "KV bytes copied host -> device.",
                  stats.kv_bytes_to_device)
    yield counter("ladle:kv_offload_copy_seconds",
                  "Device time of the host tier's copies (on the CPU: wall time).",
                  stats.kv_copy_seconds)
    yield counter("ladle:kv_offload_load_seconds",
                  "Of the copy time, the loads' (host -> device).", stats.kv_load_seconds)
    yield counter("ladle:kv_offload_stores_dropped",
                  "Write-backs a full host tier refused (the block was simply not kept).",
                  stats.num_host_stores_dropped)
    yield counter("ladle:kv_offload_stores_at_eviction",
                  "Blocks written back only as the device evicted them, so the step reusing "
                  "them waited for the copy (the look-ahead window missed them).",
                  stats.num_host_blocks_stored_at_eviction)
    yield counter("ladle:num_preemptions_swapped",
                  "Preemptions whose request resumes from the host tier (the rest recompute).",
                  stats.num_swapped_preemptions)
    yield gauge("ladle:num_requests_waiting_for_kv",
                "Requests waiting for their prefix to be loaded from the host tier.",
                stats.num_waiting_for_kv)


def _histogram(
    name: str, documentation: str, labels: list[str], values: list[str],
    bounds: tuple[float, ...], counts: tuple[int, ...], total: float,
) -> HistogramMetricFamily:
    """A histogram family of one label set from per-bucket counts (the last: above every
    bound), empty counts meaning no observations yet."""
    counts = counts or (0,) * (len(bounds) + 1)
    cumulative, buckets = 0, []
    for bound, count in zip((*map(str, bounds), "+Inf"), counts):
        cumulative += count
        buckets.append((bound, cumulative))
    family = HistogramMetricFamily(name, documentation, labels=labels)
    family.add_metric(values, buckets, total)
    return family


def _expert_load(model_name: str, counts: tuple[int, ...]) -> Iterator:
    """Mixtures of experts only: tokens routed to each expert (one series per expert, summed
    over the MoE layers, so num_experts series), and how uneven that is (the busiest expert's
    count over the mean: 1.0 is perfectly balanced, num_experts / top_k the worst)."""
    if not counts:
        return
    tokens = CounterMetricFamily(
        "ladle:moe_expert_tokens",
        "(token, expert) assignments routed to each expert since start-up, summed over the "
        "MoE layers (rows a CUDA graph pads its batch with included).",
        labels=["model_name", "expert"],
    )
    for expert, count in enumerate(counts):
        tokens.add_metric([model_name, str(expert)], count)
    yield tokens
    mean = sum(counts) / len(counts)
    imbalance = GaugeMetricFamily(
        "ladle:moe_expert_load_imbalance",
        "Busiest expert's routed tokens over the mean expert's, since start-up (1 = balanced).",
        labels=["model_name"],
    )
    imbalance.add_metric([model_name], max(counts) / mean if mean else 0.0)
    yield imbalance


class _StreamTokenCollector(Collector):
    """The two metrics the API updates for every output of every step (tokens generated, the
    inter-token histogram): plain counts here, exported at scrape time. prometheus-client's
    Counter and Histogram take a lock per update, 3.1 us an output together, a tenth of a
    core at 256 streams of 8 ms steps on a slow CPU."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.num_generation_tokens = 0
        self.itl_counts = [0] * (len(INTER_TOKEN_BUCKETS) + 1)
        self.itl_seconds = 0.0

    def collect(self) -> Iterator:
        tokens = CounterMetricFamily("vllm:generation_tokens", "Tokens generated.",
                                     labels=["model_name"])
        tokens.add_metric([self.model_name], self.num_generation_tokens)
        yield tokens
        yield _histogram(
            "vllm:inter_token_latency_seconds", "Time between consecutive tokens of a sequence.",
            ["model_name"], [self.model_name], INTER_TOKEN_BUCKETS, tuple(self.itl_counts),
            self.itl_seconds,
        )


class ServerMetrics:
    """The server's metrics; the engine client and the routes report into it."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self._engine = _EngineStatsCollector(model_name)
        self.registry.register(self._engine)
        labels = ["model_name"]
        self._model_name = self.model_name = model_name
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Prompt tokens of accepted sequences.", labels,
            registry=self.registry,
        ).labels(model_name)
        self._stream_tokens = _StreamTokenCollector(model_name)
        self.registry.register(self._stream_tokens)
        self._request_success = Counter(
            "vllm:request_success", "Finished requests by finish reason.",
            ["model_name", "finished_reason"], registry=self.registry,
        )
        self.time_to_first_token = self._histogram(
            "vllm:time_to_first_token_seconds", "Arrival to first token.", TTFT_BUCKETS
        )
        self.e2e_request_latency = self._histogram(
            "vllm:e2e_request_latency_seconds", "Arrival to last token.", REQUEST_LATENCY_BUCKETS
        )
        self.request_queue_time = self._histogram(
            "vllm:request_queue_time_seconds",
            "Arrival to first scheduled.",
            REQUEST_LATENCY_BUCKETS,
        )
        # vLLM's per-request histograms (its Grafana dashboard plots them).
        self.request_prompt_tokens = self._histogram(
            "vllm:request_prompt_tokens",
            "Prompt tokens of each finished request.",
            TOKEN_COUNT_BUCKETS,
        )
        self.request_generation_tokens = self._histogram(
            "vllm:request_generation_tokens",
            "Generated tokens of each finished request.",
            TOKEN_COUNT_BUCKETS,
        )
        self.request_prefill_time = self._histogram(
            "vllm:request_prefill_time_seconds",
            "First scheduled to first token.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_decode_time = self._histogram(
            "vllm:request_decode_time_seconds",
            "First token to last token.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_inference_time = self._histogram(
            "vllm:request_inference_time_seconds",
            "First scheduled to last token.",
            REQUEST_LATENCY_BUCKETS,
        )
        self._rejected = Counter(
            "ladle:requests_rejected", "Requests refused before reaching the engine, by reason "
            "(queue_full, too_long, bad_request, unauthorized, too_large).",
            ["model_name", "reason"], registry=self.registry,
        )
        self._aborted = Counter(
            "ladle:requests_aborted", "Requests aborted in the engine (client gone, shutdown).",
            labels, registry=self.registry,
        ).labels(model_name)
        self.engine_restarts = Counter(
            "ladle:engine_restarts", "Engine-core processes started again after one died.",
            labels, registry=self.registry,
        ).labels(model_name)

    def _histogram(self, name: str, documentation: str, buckets) -> object:
        """A histogram of this server's registry, labelled with its model name."""
        return Histogram(
            name, documentation, ["model_name"], buckets=buckets, registry=self.registry
        ).labels(self._model_name)

    # ----- reporting -------------------------------------------------------------------------

    def record_engine_stats(self, stats: SchedulerStats) -> None:
        self._engine.stats = stats

    def record_engine_dead(self) -> None:
        self._engine.engine_alive = False

    def record_engine_restarted(self) -> None:
        self._engine.engine_alive = True
        self._engine.stats = SchedulerStats()
        self.engine_restarts.inc()

    def record_step_output(self, output: RequestOutput, previous_token_time: float | None) -> None:
        """One RequestOutput that changed this step; previous_token_time is when this request
        last received tokens (None before its first)."""
        num_new_tokens = sum(len(c.token_ids_delta) for c in output.outputs)
        if num_new_tokens == 0:
            return
        stream_tokens = self._stream_tokens
        stream_tokens.num_generation_tokens += num_new_tokens
        metrics = output.metrics
        if metrics is None or metrics.last_token_time is None:
            return
        if previous_token_time is None:
            if metrics.time_to_first_token is not None:
                self.time_to_first_token.observe(max(metrics.time_to_first_token, 0.0))
        else:
            interval = max(metrics.last_token_time - previous_token_time, 0.0)
            stream_tokens.itl_counts[bisect.bisect_left(INTER_TOKEN_BUCKETS, interval)] += 1
            stream_tokens.itl_seconds += interval

    def record_finished(self, output: RequestOutput) -> None:
        metrics = output.metrics
        for completion in output.outputs:
            reason = completion.finish_reason or "abort"
            self._request_success.labels(self._model_name, reason).inc()
        self.request_prompt_tokens.observe(len(output.prompt_token_ids or ()))
        self.request_generation_tokens.observe(sum(len(c.token_ids) for c in output.outputs))
        if metrics is None:
            return
        if metrics.e2e_latency is not None:
            self.e2e_request_latency.observe(max(metrics.e2e_latency, 0.0))
        if metrics.queue_time is not None:
            self.request_queue_time.observe(max(metrics.queue_time, 0.0))
        scheduled, first, last = (
            metrics.first_scheduled_time, metrics.first_token_time, metrics.last_token_time
        )
        if scheduled is not None and first is not None:
            self.request_prefill_time.observe(max(first - scheduled, 0.0))
        if first is not None and last is not None:
            self.request_decode_time.observe(max(last - first, 0.0))
        if scheduled is not None and last is not None:
            self.request_inference_time.observe(max(last - scheduled, 0.0))

    def record_accepted(self, num_prompt_tokens: int, num_sequences: int) -> None:
        self.prompt_tokens.inc(num_prompt_tokens * num_sequences)

    def record_rejected(self, reason: str) -> None:
        self._rejected.labels(self._model_name, reason).inc()

    def record_aborted(self) -> None:
        self._aborted.inc()

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
