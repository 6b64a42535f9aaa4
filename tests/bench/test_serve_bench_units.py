"""`ladle bench serve` without a server: the summary against numpy on hand-made records, goodput
under an SLO, arrivals, and the workload classes (ShareGPT sampled as vLLM does, from a small
file cut off mid-conversation as the packaged one is)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ladle.bench.serve_run import arrival_offsets
from ladle.bench.serve_stats import RequestRecord, meets_slo, parse_slo, summarize
from ladle.bench.serve_workloads import (
    SHARED_PREFIX_TOKENS,
    WorkloadOptions,
    build_workload,
    load_sharegpt_pairs,
    parse_mix,
)
from ladle.bench.workloads import S1, build_requests


def _record(index, ttft, gaps, status=200, tokens=None):
    record = RequestRecord(index, "w", 0.0, status=status, ttft=ttft, itl=list(gaps))
    record.output_tokens = tokens if tokens is not None else len(gaps) + 1
    record.e2e = ttft + sum(gaps) if ttft is not None else 0.1
    if status != 200:
        record.error = f"HTTP {status}"
    return record


def test_summary_matches_numpy_and_counts_goodput_errors_and_cost():
    records = [
        _record(0, 0.1, [0.02, 0.03]),
        _record(1, 0.4, [0.05, 0.2, 0.01]),
        _record(2, 0.9, [0.01]),
        _record(3, None, [], status=429),
    ]
    slo = parse_slo("ttft=500ms,itl=0.1s")
    assert slo == {"ttft": 0.5, "itl": 0.1}
    summary = summarize(records, duration_s=2.0, slo=slo, gpu_hour_cost=3.6)
    assert summary["ttft_ms"]["p90"] == pytest.approx(np.percentile([100, 400, 900], 90))
    gaps = [20, 30, 50, 200, 10, 10]
    assert summary["itl_ms"]["p99"] == pytest.approx(np.percentile(gaps, 99))
    tpots = [(0.15 - 0.1) / 2 * 1000, (0.66 - 0.4) / 3 * 1000, 10.0]
    assert summary["tpot_ms"]["mean"] == pytest.approx(np.mean(tpots))
    # Only request 0 meets both bounds (1: a 200 ms gap; 2: TTFT 900 ms; 3: refused).
    assert [meets_slo(r, slo) for r in records] == [True, False, False, False]
    assert summary["goodput"] == pytest.approx(0.5)
    assert (summary["num_errors"], summary["num_rate_limited"]) == (1, 1)
    assert summary["errors"] == {"429": 1}
    assert summary["total_output_tokens"] == 3 + 4 + 2
    # $3.60 an hour for 2 s is $0.002, for 9 tokens: $222.2 per million.
    assert summary["cost_per_million_output_tokens"] == pytest.approx(0.002 / 9 * 1e6)
    with pytest.raises(ValueError, match="bad SLO term"):
        parse_slo("latency=5ms")


def test_arrivals_are_poisson_at_the_rate_and_burstiness_keeps_the_mean():
    poisson = np.diff(arrival_offsets(4000, rate=10.0, burstiness=1.0, seed=1))
    bursty = np.diff(arrival_offsets(4000, rate=10.0, burstiness=0.25, seed=1))
    assert poisson.mean() == pytest.approx(0.1, rel=0.05)
    assert bursty.mean() == pytest.approx(0.1, rel=0.1)
    # Gamma gaps: coefficient of variation 1/sqrt(shape): 1 for Poisson, 2 for shape 0.25.
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.1)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.15)
    assert arrival_offsets(3, float("inf"), 1.0, 0) == [0.0, 0.0, 0.0]


class _WordTokenizer:
    """One token per whitespace-separated word."""

    def encode(self, text):
        return [hash(word) % 1000 for word in text.split()]

    def decode(self, ids):
        return " ".join(f"w{i}" for i in ids)


def test_sharegpt_sampling_follows_vllm_filters_and_survives_a_cut_file(tmp_path):
    def conversation(human_words, reply_words):
        return {
            "conversations": [
                {"from": "human", "value": "x " * human_words},
                {"from": "gpt", "value": "y " * reply_words},
            ]
        }

    entries = [
        conversation(10, 20),
        conversation(2, 20),
        conversation(10, 3),
        conversation(1100, 10),
        conversation(900, 1200),
        {"conversations": [{"from": "human", "value": "only one turn"}]},
        conversation(30, 40),
    ]
    text = json.dumps(entries)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:-40])  # cut inside the last conversation, as the packaged file is
    assert len(load_sharegpt_pairs(str(path))) == 5  # the one-turn entry and the cut one gone
    path.write_text(text)
    options = WorkloadOptions(
        num_requests=2, seed=0, tokenizer=_WordTokenizer(), sharegpt_path=str(path)
    )
    requests = build_workload({"sharegpt": 1}, options)
    # Only (10, 20) and (30, 40) pass: < 4 tokens, a prompt > 1024 or a pair > 2048 are skipped.
    assert sorted((r.prompt_len, r.max_tokens) for r in requests) == [(10, 20), (30, 40)]
    assert all(r.messages[0]["role"] == "user" for r in requests)
    options.num_requests = 3
    with pytest.raises(ValueError, match="only 2 usable"):
        build_workload({"sharegpt": 1}, options)


def test_token_id_classes_mix_and_standard_workloads():
    options = WorkloadOptions(
        num_requests=40, seed=3, tokenizer=None, input_len=(5, 9), output_len=(2, 4)
    )
    mix = parse_mix("token-ids=3,shared-prefix=1,long-qa=1")
    requests = build_workload(mix, options)
    assert requests == build_workload(mix, options)  # seeded
    by_class = {name: [r for r in requests if r.workload == name] for name in mix}
    assert all(by_class.values())
    assert all(5 <= len(r.prompt) <= 9 and 2 <= r.max_tokens <= 4 for r in by_class["token-ids"])
    prefixes = {tuple(r.prompt[:SHARED_PREFIX_TOKENS]) for r in by_class["shared-prefix"]}
    assert len(prefixes) == 1  # one system prompt shared by every request
    assert all(4096 <= len(r.prompt) <= 8192 for r in by_class["long-qa"])
    standard = build_workload({"S1": 1}, WorkloadOptions(num_requests=5))
    assert [r.prompt for r in standard] == [r.prompt_token_ids for r in build_requests(S1, 5)]
    assert all(r.extra_body["ignore_eos"] for r in standard)
    with pytest.raises(ValueError, match="unknown workload"):
        parse_mix("chatty")
    with pytest.raises(ValueError, match="needs text prompts"):
        build_workload({"tool-calling": 1}, options)


def test_tool_calling_is_skipped_with_the_servers_reason_when_tools_are_refused(
    tmp_path, monkeypatch
):
    import asyncio
    from pathlib import Path

    import httpx

    from ladle.bench.serve_run import BenchPlan, run_plan

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert body["tools"] and body["tool_choice"] == "auto"
        return httpx.Response(400, json={"error": {"message": "tools are not supported"}})

    plan = BenchPlan(
        base_url="http://server",
        model="m",
        api_key=None,
        tokenizer=None,
        mix={"tool-calling": 1.0},
        num_prompts=2,
        points=[(1.0, None)],
        burstiness=1.0,
        seed=0,
        temperature=0.0,
        ignore_eos=False,
        token_ids=False,
        input_len=(1, 2),
        output_len=(1, 2),
        sharegpt_path=None,
        priority_fraction=None,
        slo={},
        gpu_hour_cost=None,
        output_dir=Path(tmp_path),
        label="tools",
        progress=False,
    )
    original = httpx.AsyncClient

    class _Mocked(original):
        def __init__(self, **kwargs):
            super().__init__(transport=httpx.MockTransport(handler), **kwargs)

    monkeypatch.setattr(httpx, "AsyncClient", _Mocked)
    result = asyncio.run(run_plan(plan))
    assert result["runs"] == []
    assert "HTTP 400" in result["skipped_workloads"]["tool-calling"]
    assert "tools are not supported" in result["skipped_workloads"]["tool-calling"]
    assert json.loads((tmp_path / "results.json").read_text())["skipped_workloads"]


class _FakeClock:
    """time.perf_counter for serve_client: advanced by the fake stream, read by the client."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _FakeContent:
    def __init__(self, reads: list[tuple[float, bytes]], clock: _FakeClock) -> None:
        self.reads, self.clock = reads, clock

    async def iter_any(self):
        for delay, data in self.reads:
            self.clock.now += delay
            yield data


class _FakeResponse:
    def __init__(self, status: int, reads: list[tuple[float, bytes]], clock: _FakeClock) -> None:
        self.status = status
        self.content = _FakeContent(reads, clock)

    async def read(self) -> bytes:
        return b"".join(data for _, data in self.content.reads)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        return False


class _FakeSession:
    """aiohttp.ClientSession's post() as serve_client uses it: every response is made of
    `reads` (seconds to wait before the read, the bytes it returns) on a fake clock."""

    def __init__(self, reads: list[tuple[float, bytes]], clock: _FakeClock | None = None):
        self.reads, self.clock = reads, clock or _FakeClock()
        self.sent: list[dict] = []

    def post(self, url: str, json: dict, headers: dict) -> _FakeResponse:
        self.sent.append(json)
        return _FakeResponse(200, self.reads, self.clock)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        return False


def _sse(*chunks: dict) -> bytes:
    return "".join(f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks).encode()


def _send_one(reads: list[tuple[float, bytes]], monkeypatch) -> RequestRecord:
    import asyncio

    from ladle.bench import serve_client
    from ladle.bench.serve_client import BenchRequest, send_request

    clock = _FakeClock()
    monkeypatch.setattr(serve_client.time, "perf_counter", clock)

    async def run():
        record = RequestRecord(0, "w", 0.0)
        request = BenchRequest("w", 3, 2, prompt=[1, 2, 3])
        session = _FakeSession(reads, clock)
        return await send_request(session, "http://x", request, record, "m", 0.0, {}, 0.0)

    return asyncio.run(run())


def test_a_token_holding_a_unicode_line_separator_does_not_cut_a_chunk(monkeypatch):
    """Regression: httpx's aiter_lines split on U+2028 / U+0085 inside a JSON string."""
    body = _sse(
        {"choices": [{"index": 0, "text": "a\u2028b"}]},
        {"choices": [{"index": 0, "text": "c\u0085d\r"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}},
    ).replace(b"\n\n", b"\r\n\r\n") + b"data: [DONE]\n\n"
    record = _send_one([(0.0, body)], monkeypatch)
    assert record.error is None and record.success
    assert (record.output_tokens, len(record.itl), record.prompt_tokens) == (2, 1, 3)


def test_itl_times_each_event_by_the_read_that_brought_it(monkeypatch):
    """A synthetic stream on a fake clock: events in one read share its time (gap 0), an event
    split over two reads counts when it completes, a chunk of three tokens is one gap, empty
    and usage chunks are no events; TTFT runs from the send to the first content read."""

    def token(text: str, num_tokens: int = 1) -> dict:
        logprobs = {"tokens": [text] * num_tokens, "token_logprobs": [-1.0] * num_tokens}
        return {"choices": [{"index": 0, "text": text * num_tokens, "logprobs": logprobs}]}

    first, second, third = _sse(token("a")), _sse(token("b")), _sse(token("c"))
    reads = [
        (0.050, first),  # TTFT 50 ms
        (0.007, second + third),  # two events in one read: gaps of 7 ms and 0
        (0.007, _sse(token("d"))[:20]),  # half an event: it completes with the next read
        (0.003, _sse(token("d"))[20:]),
        (0.021, _sse(token("e", 3))),  # three tokens in one chunk (merged steps): one gap
        (0.001, _sse({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})),
        (0.001, _sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}})),
        (0.0, b"data: [DONE]\n\n"),
    ]
    record = _send_one(reads, monkeypatch)
    assert record.success
    assert record.ttft == pytest.approx(0.050)
    assert record.itl == pytest.approx([0.007, 0.0, 0.010, 0.021])
    assert (record.num_chunks, record.output_tokens) == (5, 7)
    assert record.e2e == pytest.approx(0.090)
    summary = summarize([record], 1.0, {}, None)
    assert summary["tokens_per_chunk"] == pytest.approx(7 / 5)
    assert summary["itl_ms"]["p50"] == pytest.approx(np.percentile([7.0, 0.0, 10.0, 21.0], 50))


def test_scraped_metrics_add_counts_and_average_kv_usage_over_replicas():
    from ladle.bench.serve_scrape import parse_metrics

    text = (
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{replica="0"} 0.6\n'
        'vllm:kv_cache_usage_perc{replica="1"} 0.2\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{replica="0"} 3\n'
        'vllm:num_requests_waiting{replica="1"} 4\n'
        "# TYPE vllm:prefix_cache_hits counter\n"
        'vllm:prefix_cache_hits_total{replica="0"} 10\n'
        'vllm:prefix_cache_hits_total{replica="1"} 5\n'
    )
    values = parse_metrics(text)
    assert values["vllm:kv_cache_usage_perc"] == pytest.approx(0.4)
    assert values["vllm:num_requests_waiting"] == 7
    assert values["vllm:prefix_cache_hits_total"] == 15


def test_duration_sizes_each_finite_rate_point_and_inf_keeps_num_prompts(tmp_path, monkeypatch):
    """--duration D: a point at rate R sends round(R x D) requests (a sweep's high rates get a
    steady state, not a short burst); an inf point sends --num-prompts."""
    import asyncio
    import math

    import httpx

    from ladle.bench import serve_run
    from ladle.bench.serve_run import BenchPlan, run_plan

    body = b'data: {"choices": [{"index": 0, "text": "a"}]}\n\ndata: [DONE]\n\n'
    streams = _FakeSession([(0.0, body)])
    monkeypatch.setattr(serve_run, "open_stream_session", lambda plan: streams)

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"  # the timed requests go through `streams`
        return httpx.Response(404)

    plan = BenchPlan(
        base_url="http://server",
        model="m",
        api_key=None,
        tokenizer=None,
        mix={"token-ids": 1.0},
        num_prompts=3,
        duration_s=0.25,
        points=[(20.0, None), (math.inf, None), (42.0, None)],
        burstiness=1.0,
        seed=0,
        temperature=0.0,
        ignore_eos=True,
        token_ids=True,
        input_len=(1, 2),
        output_len=(1, 2),
        sharegpt_path=None,
        priority_fraction=None,
        slo={},
        gpu_hour_cost=None,
        output_dir=tmp_path,
        label="duration",
        plots=False,
        progress=False,
    )
    original = httpx.AsyncClient

    class _Mocked(original):
        def __init__(self, **kwargs):
            super().__init__(transport=httpx.MockTransport(handler), **kwargs)

    monkeypatch.setattr(httpx, "AsyncClient", _Mocked)
    result = asyncio.run(run_plan(plan))
    assert [len(run["records"]) for run in result["runs"]] == [5, 3, 10]  # 20*.25, 3, 42*.25
    assert len(streams.sent) == 18
    assert result["duration_s"] == 0.25


def test_duration_must_be_positive():
    import argparse

    from ladle.bench.serve import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--duration", "0", "--token-ids"])
    with pytest.raises(ValueError, match="--duration must be > 0"):
        args.handler(args)
