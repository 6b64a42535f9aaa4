"""The drafted step's fused kernels (kernels/draft_steps.py) against its torch path
(worker/drafts_on_device.py), end to end: an overlapped n-gram engine with the kernels gives
the tokens of the engine without speculation (greedy), and with synthetic acceptance exactly the
tokens and counters of the torch path (the same coins).

Runs under Triton's interpreter on the CPU (a child pytest with TRITON_INTERPRET=1, as
test_fused_moe_interpreter.py does); skipped where Triton is not installed. The same checks run
compiled on a GPU in tests/gpu/test_draft_step_kernels_gpu.py.
"""

from __future__ import annotations

import pytest
from helpers.interpreter import interpreted, parent_only, run_in_interpreter_child

from ladle import LLM, SamplingParams

pytest.importorskip("triton")

# Device drafts are opt-in (config/speculative.py, until measured on a GPU).
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "adaptive": False,
    "drafts_on_device": True,
}
OPTIONS = {"cpu_kv_cache_gib": 0.1, "block_size": 4, "max_num_seqs": 16}


@pytest.mark.slow
@parent_only
def test_kernels_under_the_interpreter():
    run_in_interpreter_child(__file__)


def repetitive_prompts(count: int) -> list[dict]:
    import random

    rng = random.Random(0)
    prompts = []
    for _ in range(count):
        phrase = [rng.randrange(5, 500) for _ in range(rng.randint(2, 6))]
        prompt = [rng.randrange(5, 500) for _ in range(rng.randint(0, 5))]
        prompts.append({"prompt_token_ids": prompt + phrase * rng.randint(2, 4)})
    return prompts


def engine_with_kernels(model_path: str, speculative_config: dict, kernels: bool) -> LLM:
    llm = LLM(
        model_path, async_scheduling=True, speculative_config=speculative_config, **OPTIONS
    )
    device_drafts = llm.engine.executor.worker.runner.device_drafts
    assert device_drafts is not None
    device_drafts.kernels = kernels
    return llm


def tokens(outputs) -> list[list[int]]:
    return [list(output.outputs[0].token_ids) for output in outputs]


@interpreted
def test_greedy_tokens_with_the_kernels_equal_those_without_speculation(tiny_model_path):
    path = tiny_model_path("llama")
    prompts = repetitive_prompts(6)
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    expected = tokens(LLM(path, **OPTIONS).generate(prompts, params, use_tqdm=False))
    llm = engine_with_kernels(path, NGRAM, kernels=True)
    assert tokens(llm.generate(prompts, params, use_tqdm=False)) == expected
    stats = llm.engine.get_stats()
    assert stats.spec_decode.num_accepted_tokens > 5
    assert stats.num_free_blocks == stats.num_total_blocks


@interpreted
def test_synthetic_verdicts_of_the_kernels_equal_the_torch_path(tiny_model_path):
    path = tiny_model_path("llama")
    config = {**NGRAM, "synthetic_acceptance": 0.6}
    prompts = repetitive_prompts(4)
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    runs = []
    for kernels in (False, True):
        llm = engine_with_kernels(path, config, kernels)
        got = tokens(llm.generate(prompts, params, use_tqdm=False))
        spec = llm.engine.get_stats().spec_decode
        runs.append((got, spec.num_draft_tokens, spec.num_accepted_tokens))
    assert runs[0] == runs[1]
    assert runs[0][2] > 5
