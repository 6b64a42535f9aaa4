"""Metric names (vLLM's where vLLM has one) and what feeds them."""

from __future__ import annotations

from prometheus_client import generate_latest

from ladle.frontend.metrics import ServerMetrics
from ladle.outputs import CompletionOutput, RequestMetrics, RequestOutput
from ladle.protocol.messages import SchedulerStats
from tests.entrypoints.server_process import parse_metrics

VLLM_NAMES = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
    "vllm:e2e_request_latency_seconds_count",
]


def make_output(num_new: int, first_token_time: float, last_token_time: float,
                finished: bool = False) -> RequestOutput:
    completion = CompletionOutput(index=0, token_ids=[1] * num_new, token_ids_delta=[1] * num_new,
                                  finish_reason="length" if finished else None)
    metrics = RequestMetrics(arrival_time=0.0, first_scheduled_time=0.1,
                             first_token_time=first_token_time, last_token_time=last_token_time,
                             finished_time=last_token_time if finished else None)
    return RequestOutput("r", None, [1, 2], [completion], finished=finished, metrics=metrics)


def test_names_and_values():
    metrics = ServerMetrics("tiny")
    metrics.record_engine_stats(SchedulerStats(
        num_running_reqs=2, num_waiting_reqs=5, kv_cache_usage=0.5, prefix_cache_queries=100,
        prefix_cache_hits=25, num_preemptions=3, num_free_blocks=7, num_total_blocks=10,
    ))
    metrics.record_accepted(num_prompt_tokens=10, num_sequences=2)
    metrics.record_step_output(make_output(1, 0.5, 0.5), previous_token_time=None)
    metrics.record_step_output(make_output(1, 0.5, 0.7), previous_token_time=0.5)
    final = make_output(1, 0.5, 0.9, finished=True)
    metrics.record_step_output(final, previous_token_time=0.7)
    metrics.record_finished(final)
    metrics.record_rejected("queue_full")
    text = metrics.render().decode()
    values = parse_metrics(text)
    for name in VLLM_NAMES:
        assert name in values, name
    assert 'model_name="tiny"' in text
    assert values["vllm:num_requests_running"] == 2
    assert values["vllm:num_requests_waiting"] == 5
    assert values["vllm:kv_cache_usage_perc"] == 0.5
    assert values["vllm:prefix_cache_hits_total"] == 25
    assert values["ladle:prefix_cache_hit_rate"] == 0.25
    assert values["vllm:num_preemptions_total"] == 3
    assert values["vllm:prompt_tokens_total"] == 20
    assert values["vllm:generation_tokens_total"] == 3
    assert values["vllm:time_to_first_token_seconds_count"] == 1
    assert values["vllm:time_to_first_token_seconds_sum"] == 0.5
    assert values["vllm:inter_token_latency_seconds_count"] == 2
    assert abs(values["vllm:e2e_request_latency_seconds_sum"] - 0.9) < 1e-9
    assert values["vllm:request_success_total"] == 1
    assert values["ladle:requests_rejected_total"] == 1
    assert values["ladle:engine_alive"] == 1
    metrics.record_engine_dead()
    assert parse_metrics(metrics.render().decode())["ladle:engine_alive"] == 0


def test_two_servers_in_one_process_do_not_collide():
    ServerMetrics("a")
    ServerMetrics("a")


def test_step_time_histogram_by_kind():
    """The engine's step times: cumulative buckets per kind, the sum, and the count."""
    from ladle.engine.step_meter import StepMeter

    meter = StepMeter()
    meter.record(num_prefill=0, num_decode=128, seconds=0.003)  # decode, in (2.5, 5] ms
    meter.record(num_prefill=0, num_decode=128, seconds=0.0049)
    meter.record(num_prefill=900, num_decode=128, seconds=0.05)  # mixed: kind=prefill
    meter.record(num_prefill=0, num_decode=0, seconds=0.5)  # nothing computed: not counted
    metrics = ServerMetrics("tiny")
    metrics.record_engine_stats(SchedulerStats(
        prefill_step_counts=tuple(meter.prefill_step_counts),
        decode_step_counts=tuple(meter.decode_step_counts),
        prefill_step_seconds=meter.prefill_step_seconds,
        decode_step_seconds=meter.decode_step_seconds,
    ))
    text = metrics.render().decode()
    values = {
        line.rpartition(" ")[0]: float(line.rpartition(" ")[2])
        for line in text.splitlines() if line.startswith("ladle:step_duration_seconds")
    }

    def bucket(kind, le):
        return next(
            value for name, value in values.items()
            if name.startswith("ladle:step_duration_seconds_bucket")
            and f'kind="{kind}"' in name and f'le="{le}"' in name
        )

    assert bucket("decode", "0.0025") == 0
    assert bucket("decode", "0.005") == 2
    assert bucket("decode", "+Inf") == 2
    assert bucket("prefill", "0.04") == 0
    assert bucket("prefill", "0.08") == 1
    sums = {name: value for name, value in values.items() if "_sum" in name}
    assert abs(sum(v for n, v in sums.items() if 'kind="decode"' in n) - 0.0079) < 1e-9
    assert abs(sum(v for n, v in sums.items() if 'kind="prefill"' in n) - 0.05) < 1e-9


def test_inter_token_histogram_matches_prometheus_clients_own():
    """vllm:inter_token_latency_seconds is counted without prometheus-client's per-update lock;
    its buckets, count and sum must be what prometheus-client's Histogram gives the same gaps
    (values on a bound fall in that bound's bucket)."""
    from prometheus_client import CollectorRegistry, Histogram

    from ladle.frontend.metrics import INTER_TOKEN_BUCKETS

    gaps = [0.0, 0.004, 0.0075, 0.01, 0.0100001, 0.3, 0.3, 79.9, 100.0]
    metrics = ServerMetrics("m")
    reference_registry = CollectorRegistry()
    reference = Histogram("vllm:inter_token_latency_seconds", "x", buckets=INTER_TOKEN_BUCKETS,
                          registry=reference_registry)
    previous = 1.0
    metrics.record_step_output(make_output(1, previous, previous), previous_token_time=None)
    for gap in gaps:
        token_time = previous + gap
        metrics.record_step_output(make_output(1, 1.0, token_time), previous)
        reference.observe(token_time - previous)  # the gap as the float subtraction gives it
        previous = token_time
    for bound in (0.01, 0.025, 0.3):  # exactly on a bound: that bound's bucket
        metrics.record_step_output(make_output(1, 1.0, bound), previous_token_time=0.0)
        reference.observe(bound)

    def samples(text: str) -> dict[str, float]:
        values = {}
        for line in text.splitlines():
            if line.startswith("vllm:inter_token_latency_seconds_"):
                name, _, value = line.rpartition(" ")
                values[name.replace(',model_name="m"', "").replace('{model_name="m"}', "")] = (
                    float(value)
                )
        return values

    ours = samples(metrics.render().decode())
    expected = samples(generate_latest(reference_registry).decode())
    expected.pop("vllm:inter_token_latency_seconds_created", None)
    assert ours.keys() == expected.keys()
    for name, value in expected.items():
        assert abs(ours[name] - value) < 1e-6, name
    assert parse_metrics(metrics.render().decode())["vllm:generation_tokens_total"] == 13


def test_host_tier_metrics():
    metrics = ServerMetrics("tiny")
    metrics.record_engine_stats(SchedulerStats(
        host_cache_queries=400, host_cache_hits=96, num_host_blocks=100,
        num_host_cached_blocks=40, host_kv_usage=0.03, kv_bytes_to_host=8192,
        kv_bytes_to_device=4096, kv_copy_seconds=0.25, kv_load_seconds=0.125, num_preemptions=4,
        num_swapped_preemptions=3, num_waiting_for_kv=2, num_host_stores_dropped=5,
        num_host_blocks_stored_at_eviction=6,
    ))
    values = parse_metrics(metrics.render().decode())
    assert values["vllm:external_prefix_cache_queries_total"] == 400
    assert values["vllm:external_prefix_cache_hits_total"] == 96
    assert values["ladle:kv_offload_misses_total"] == 304
    assert values["vllm:cpu_cache_usage_perc"] == 0.03
    assert values["ladle:kv_offload_cached_blocks"] == 40
    assert values["ladle:kv_offload_total_blocks"] == 100
    assert values["ladle:kv_offload_bytes_to_host_total"] == 8192
    assert values["ladle:kv_offload_bytes_to_device_total"] == 4096
    assert values["ladle:kv_offload_copy_seconds_total"] == 0.25
    assert values["ladle:kv_offload_load_seconds_total"] == 0.125
    assert values["ladle:kv_offload_stores_dropped_total"] == 5
    assert values["ladle:kv_offload_stores_at_eviction_total"] == 6
    assert values["ladle:num_preemptions_swapped_total"] == 3
    assert values["ladle:num_requests_waiting_for_kv"] == 2


def test_spec_decode_metrics_only_while_speculation_is_on():
    from ladle.protocol.messages import SpecDecodeStats

    metrics = ServerMetrics("tiny")
    metrics.record_engine_stats(SchedulerStats())
    assert "spec_decode" not in metrics.render().decode()
    spec = SpecDecodeStats(
        num_drafts=10, num_draft_tokens=30, num_accepted_tokens=14,
        num_accepted_tokens_per_pos=[8, 4, 2], acceptance_length_counts=[2, 4, 2, 2],
        drafting_seconds=0.25,
    )
    metrics.record_engine_stats(SchedulerStats(spec_decode=spec))
    text = metrics.render().decode()
    values = parse_metrics(text)
    assert values["vllm:spec_decode_num_drafts_total"] == 10
    assert values["vllm:spec_decode_num_draft_tokens_total"] == 30
    assert values["vllm:spec_decode_num_accepted_tokens_total"] == 14
    per_position = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    assert f'{per_position}{{model_name="tiny",position="1"}} 4.0' in text
    # Acceptance lengths 1, 2, 3, 4 seen 2, 4, 2, 2 times: cumulative buckets, sum 1*2+2*4+3*2+4*2.
    assert 'ladle:spec_decode_acceptance_length_bucket{le="2.0",model_name="tiny"} 6.0' in text
    assert values["ladle:spec_decode_acceptance_length_count"] == 10
    assert values["ladle:spec_decode_acceptance_length_sum"] == 24
    assert values["ladle:spec_decode_drafting_seconds_total"] == 0.25


def test_vllm_per_request_histograms():
    """vLLM's request_prompt_tokens / request_generation_tokens and its prefill / decode /
    inference time histograms, from a finished request's counts and timestamps."""
    metrics = ServerMetrics("tiny")
    completions = [
        CompletionOutput(index=i, token_ids=[1] * count, finish_reason="length")
        for i, count in enumerate((3, 4))
    ]
    timings = RequestMetrics(arrival_time=0.0, first_scheduled_time=0.25, first_token_time=1.0,
                             last_token_time=3.5, finished_time=3.5)
    metrics.record_finished(
        RequestOutput("r", None, [1] * 12, completions, finished=True, metrics=timings)
    )
    values = parse_metrics(metrics.render().decode())
    assert values["vllm:request_prompt_tokens_count"] == 1
    assert values["vllm:request_prompt_tokens_sum"] == 12
    assert values["vllm:request_generation_tokens_sum"] == 7
    assert values["vllm:request_prefill_time_seconds_sum"] == 0.75
    assert values["vllm:request_decode_time_seconds_sum"] == 2.5
    assert values["vllm:request_inference_time_seconds_sum"] == 3.25
    assert values["vllm:request_queue_time_seconds_sum"] == 0.25
