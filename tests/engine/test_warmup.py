"""The start-up warm-up (run on CUDA) must leave no trace: no request left behind, nothing in the
prefix cache, and the same tokens afterwards as an engine that never warmed up. Run here on the
CPU, where EngineCore skips it, by calling it directly."""

from __future__ import annotations

from ladle import LLM, SamplingParams
from ladle.engine.warmup import warm_up, warmup_prompt_lengths


def test_prompt_lengths_cover_each_power_of_two_tile():
    assert warmup_prompt_lengths(100) == [2, 3, 5, 9, 17, 33, 65, 100]
    assert warmup_prompt_lengths(2) == [2]


def test_warm_up_leaves_no_trace(tiny_model_path):
    path = tiny_model_path("qwen3")
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [3, 4]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True),  # engine-drawn seed
    ]
    options = dict(block_size=4, num_kv_blocks=300, max_num_batched_tokens=64, max_num_seqs=16)
    cold = LLM(path, **options)
    expected = [o.outputs[0].token_ids for o in cold.generate(prompts, params, use_tqdm=False)]

    warm = LLM(path, **options)
    num_steps = warm_up(warm.engine)
    # The staggered prompts, then the full batch: one prefill step and one decode step at least.
    assert num_steps >= len(warmup_prompt_lengths(60)) + 2
    engine = warm.engine
    assert not engine.has_unfinished_requests()
    stats = engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.prefix_cache_queries == 0
    got = [o.outputs[0].token_ids for o in warm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    # Nothing of the warm-up is cached: the first prompt finds no hit.
    assert engine.get_stats().prefix_cache_hits == 0


def test_warm_up_drafts_through_every_sampling_feature_then_forgets_it(tiny_model_path):
    """With speculation on, the warm-up's drafting requests verify drafts (so the draft and
    verify kernels are built at start-up) alone and beside every sampling feature, and the
    speculator forgets them: no metrics, no load measurements (none reported), and the same
    tokens after."""
    path = tiny_model_path("qwen3")
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1}
    options = dict(block_size=4, num_kv_blocks=400, max_num_batched_tokens=64, max_num_seqs=16,
                   speculative_config=spec)  # fmt: skip
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [3, 4, 3, 4, 3]]
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=7, max_tokens=12, ignore_eos=True),
    ]
    cold = LLM(path, **options)
    expected = [o.outputs[0].token_ids for o in cold.generate(prompts, params, use_tqdm=False)]

    warm = LLM(path, **options)
    engine = warm.engine
    speculator = engine.speculator
    seen = {}
    forget = speculator.forget_warm_up

    def forget_after_counting():
        seen["drafts"] = speculator.stats.num_drafts
        seen["levels"] = set(speculator.governor.levels)
        forget()

    speculator.forget_warm_up = forget_after_counting
    reports = []  # the governor's changes of mind: none from the warm-up, then the users'
    speculator.report = speculator.governor.report = reports.append
    warm_up(engine)
    assert reports == [] and speculator.governor.report == reports.append
    assert seen["drafts"] >= 2, seen  # verified drafts alone and in the batch
    assert {1, 8} <= seen["levels"], seen  # one request, then the sampling features' batch
    assert speculator.stats.num_drafts == 0 and not speculator.governor.levels
    assert not speculator.acceptance and not engine.has_unfinished_requests()
    stats = engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    got = [o.outputs[0].token_ids for o in warm.generate(prompts, params, use_tqdm=False)]
    assert got == expected


def test_memory_probe_runs_the_real_step_and_keeps_the_cache(tiny_model_path):
    """The probe (run on CUDA before the KV cache is sized) goes through execute on dummy
    requests with a one-block cache; the engine's own cache must come back untouched."""
    llm = LLM(tiny_model_path("llama"), block_size=4, num_kv_blocks=50, max_num_batched_tokens=40)
    runner = llm.engine.executor.worker
    caches = runner.kv_caches
    snapshot = [cache.clone() for cache in caches]
    runner._run_peak_forward()
    runner._run_graph_probe()
    assert runner.kv_caches is caches
    assert all(c.equal(s) for c, s in zip(caches, snapshot))
