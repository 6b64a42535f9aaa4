"""LLM.get_metrics() as vLLM's offline reader: its speculative decoding example's loop reads
the drafts and accepted tokens (a draft model that is the target itself, greedy, has every
draft accepted), and the token and request counters match the outputs returned."""

from __future__ import annotations

import pytest

from ladle import LLM, SamplingParams
from ladle.entrypoints.metrics_reader import Counter, Gauge, Vector

ENGINE_OPTIONS = {"cpu_kv_cache_gib": 0.05, "block_size": 4, "max_num_seqs": 8}
PROMPTS = [{"prompt_token_ids": [7, 8, 9, 10, 11, 12]}, {"prompt_token_ids": [40, 41, 42]}]
K = 3


def _by_name(metrics) -> dict:
    return {metric.name: metric for metric in metrics}


@pytest.fixture(scope="module")
def target(tiny_model_path) -> str:
    return tiny_model_path("llama")


def test_vllm_spec_decode_example_reads_acceptance(target):
    llm = LLM(target, speculative_config={"method": "draft_model", "model": target,
                                          "num_speculative_tokens": K},
              disable_log_stats=False, **ENGINE_OPTIONS)
    params = SamplingParams(temperature=0, max_tokens=13, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    # vLLM's examples/offline_inference/spec_decode.py, unchanged but for the imports.
    num_drafts = num_draft_tokens = num_accepted_tokens = 0
    acceptance_counts = [0] * K
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_drafts":
            assert isinstance(metric, Counter)
            num_drafts += metric.value
        elif metric.name == "vllm:spec_decode_num_draft_tokens":
            assert isinstance(metric, Counter)
            num_draft_tokens += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens":
            assert isinstance(metric, Counter)
            num_accepted_tokens += metric.value
        elif metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            assert isinstance(metric, Vector)
            for pos in range(len(metric.values)):
                acceptance_counts[pos] += metric.values[pos]
    assert num_drafts > 0 and num_draft_tokens >= num_drafts
    # The target drafting for itself greedily: every draft is what it then samples.
    assert num_accepted_tokens == num_draft_tokens
    assert sum(acceptance_counts) == num_accepted_tokens
    assert acceptance_counts == sorted(acceptance_counts, reverse=True)
    # Each drafted step emits its accepted drafts plus one sampled token, never more than asked.
    generated = sum(len(output.outputs[0].token_ids) for output in outputs)
    assert generated == 2 * 13
    assert num_accepted_tokens + num_drafts <= generated


def test_token_and_request_counters_match_the_outputs(target):
    llm = LLM(target, **ENGINE_OPTIONS)
    assert "vllm:spec_decode_num_drafts" not in _by_name(llm.get_metrics())
    outputs = llm.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, n=2),
        use_tqdm=False,
    )
    streamed = list(llm.stream(["Hello there"], SamplingParams(max_tokens=4, ignore_eos=True)))
    metrics = _by_name(llm.get_metrics())
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    prompt_tokens += len(streamed[-1][1].prompt_token_ids)
    assert metrics["vllm:prompt_tokens"].value == prompt_tokens
    assert metrics["vllm:generation_tokens"].value == 2 * 2 * 5 + 4
    success = [m for m in llm.get_metrics() if m.name == "vllm:request_success"]
    assert [(m.labels["finished_reason"], m.value) for m in success] == [("length", 5)]
    running = metrics["vllm:num_requests_running"]
    assert isinstance(running, Gauge) and running.value == 0
    assert metrics["vllm:kv_cache_usage_perc"].value == 0.0
