"""ladle's greedy tokens equal HF transformers' for tiny random Llama, Qwen2 and Qwen3 models,
whatever the batching: all together, one by one, chunked prefill, prefix-cache hits, preemption."""

from __future__ import annotations

import random

import pytest
from helpers.tiny_models import hf_greedy

from ladle import LLM, SamplingParams

ARCHITECTURES = ["llama", "qwen2", "qwen3"]
NUM_NEW_TOKENS = 12


def make_prompts(vocab_size: int, seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(length)] for length in lengths]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def reference(request, tiny_model_path):
    from helpers.tiny_models import load_hf_reference

    path = tiny_model_path(request.param)
    model = load_hf_reference(path)
    vocab_size = model.config.vocab_size
    prompts = make_prompts(vocab_size, seed=7, lengths=[1, 3, 7, 16, 17, 30, 45, 64])
    expected = [hf_greedy(model, prompt, NUM_NEW_TOKENS) for prompt in prompts]
    return path, prompts, expected


def greedy(max_tokens: int = NUM_NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def token_ids(outputs) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in outputs]


def test_batched_and_one_by_one_match_hf(reference):
    path, prompts, expected = reference
    llm = LLM(path, block_size=4, num_kv_blocks=400)
    assert token_ids(llm.generate(prompts, greedy(), use_tqdm=False)) == expected
    one_by_one = [token_ids(llm.generate([p], greedy(), use_tqdm=False))[0] for p in prompts]
    assert one_by_one == expected


def test_chunked_prefill_matches_hf(reference):
    path, prompts, expected = reference
    # A budget of 10 tokens splits every prompt longer than that over several steps, while
    # earlier requests decode in the same steps.
    llm = LLM(
        path,
        block_size=4,
        num_kv_blocks=400,
        max_num_batched_tokens=10,
        enable_prefix_caching=False,
    )
    assert token_ids(llm.generate(prompts, greedy(), use_tqdm=False)) == expected


def test_prefix_cache_hits_match_hf(reference):
    path, prompts, expected = reference
    llm = LLM(path, block_size=4, num_kv_blocks=400)
    first = llm.generate(prompts, greedy(), use_tqdm=False)
    # The same prompts again: every full block of each prompt is now cached.
    second = llm.generate(prompts, greedy(), use_tqdm=False)
    assert token_ids(first) == expected
    assert token_ids(second) == expected
    longest = max(range(len(prompts)), key=lambda i: len(prompts[i]))
    assert second[longest].num_cached_tokens == (len(prompts[longest]) - 1) // 4 * 4
    stats = llm.engine.get_stats()
    assert stats.prefix_cache_hits > 0
    assert stats.num_free_blocks == stats.num_total_blocks


def test_shared_prefix_in_one_batch_matches_hf(tiny_model_path):
    from helpers.tiny_models import load_hf_reference

    path = tiny_model_path("qwen3")
    model = load_hf_reference(path)
    shared = make_prompts(model.config.vocab_size, seed=11, lengths=[24])[0]
    tails = make_prompts(model.config.vocab_size, seed=12, lengths=[1, 5, 9])
    prompts = [shared + tail for tail in tails]
    expected = [hf_greedy(model, prompt, NUM_NEW_TOKENS) for prompt in prompts]
    llm = LLM(path, block_size=4, num_kv_blocks=400, max_num_batched_tokens=32)
    # The first request's prefix is computed (in chunks) before the others are admitted, so
    # they hit its blocks.
    outputs = llm.generate(prompts, greedy(), use_tqdm=False)
    assert token_ids(outputs) == expected
    assert llm.engine.get_stats().prefix_cache_hits >= 24


def test_preemption_matches_hf(reference):
    path, prompts, expected = reference
    # 26 usable blocks of 4 tokens: the longest request alone needs 19, so running all eight
    # at once must preempt, and preempted requests are recomputed.
    llm = LLM(path, block_size=4, num_kv_blocks=27)
    outputs = llm.generate(prompts, greedy(), use_tqdm=False)
    assert token_ids(outputs) == expected
    stats = llm.engine.get_stats()
    assert stats.num_preemptions > 0
    assert stats.num_free_blocks == stats.num_total_blocks


def test_every_cpu_model_run_is_counted_as_eager(reference):
    # /metrics' ladle:eager_steps and ladle:graph_steps: the CPU never replays a graph, and one
    # prompt of 5 new tokens takes 5 model runs (the prompt's step samples the first token).
    path, prompts, _ = reference
    llm = LLM(path, block_size=4, num_kv_blocks=400, async_scheduling=False)
    before = llm.engine.get_stats()
    llm.generate([prompts[0]], greedy(5), use_tqdm=False)
    after = llm.engine.get_stats()
    assert after.num_graph_steps == 0
    assert after.num_eager_steps - before.num_eager_steps == 5


def test_slow_steps_are_logged_with_their_shape(reference, monkeypatch, capsys):
    # LADLE_SLOW_STEP_MS: every step over it gets a line naming its shape (here every step).
    path, prompts, _ = reference
    monkeypatch.setenv("LADLE_SLOW_STEP_MS", "0.000001")
    llm = LLM(path, block_size=4, num_kv_blocks=400, async_scheduling=False)
    capsys.readouterr()
    llm.generate([prompts[0]], greedy(3), use_tqdm=False)
    lines = [line for line in capsys.readouterr().err.splitlines() if "slow step" in line]
    assert len(lines) == 3
    assert f"1 requests, {len(prompts[0])} prompt tokens, 0 decodes" in lines[0]
    assert all("eager" in line for line in lines)
    assert "1 requests, 0 prompt tokens, 1 decodes" in lines[1]
    monkeypatch.setenv("LADLE_SLOW_STEP_MS", "fast")
    assert LLM(path, block_size=4, num_kv_blocks=400).engine.slow_step_s is None
