"""Model drafts on CUDA with graphs on (the target's verify and decode steps replay graphs; the
drafter runs eagerly): greedy tokens with a draft model (the target itself) and with a random
EAGLE-3 head equal those without speculation, in float32 exactly (up to the near-tie the
n-gram GPU test allows) and in bfloat16 for most requests; the self-draft accepts nearly all."""

from __future__ import annotations

import random

import pytest
import torch
from helpers.eagle_heads import save_eagle_head
from helpers.tiny_models import GPU_SHAPE

from ladle import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from helpers.tiny_models import save_tiny_model

    return save_tiny_model(
        tmp_path_factory.mktemp("model_drafts_gpu"), "llama", num_hidden_layers=4, **GPU_SHAPE
    )


@pytest.fixture(scope="module")
def head_path(model_path, tmp_path_factory):
    return save_eagle_head(tmp_path_factory.mktemp("head_gpu"), model_path, "eagle3",
                           draft_vocab_size=128)


def _prompts(count: int) -> list[dict]:
    rng = random.Random(0)
    return [
        {"prompt_token_ids": [rng.randrange(4, 500) for _ in range(rng.randint(3, 60))]}
        for _ in range(count)
    ]


def _run(path, dtype, speculative, prompts, params, **options):
    llm = LLM(str(path), dtype=dtype, num_kv_blocks=4096, max_num_seqs=64,
              max_num_batched_tokens=1024, speculative_config=speculative, **options)
    executor = llm.engine.executor
    graph_before = executor.num_graph_steps
    outputs = llm.generate(prompts, params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    stats = llm.engine.get_stats()
    graph_steps = executor.num_graph_steps - graph_before
    del llm
    torch.cuda.empty_cache()
    return tokens, stats, graph_steps


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_greedy_parity_with_model_drafts(model_path, head_path, dtype, method):
    prompts = _prompts(96)
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    want, _, _ = _run(model_path, dtype, None, prompts, params)
    draft = model_path if method == "draft_model" else head_path
    speculative = {"method": method, "model": draft, "num_speculative_tokens": 4,
                   "adaptive": False}
    got, stats, graph_steps = _run(model_path, dtype, speculative, prompts, params)
    spec = stats.spec_decode
    print(f"\n[model drafts gpu {method} {dtype}] graph steps {graph_steps}, drafted "
          f"{spec.num_draft_tokens}, accepted {spec.num_accepted_tokens}, drafting "
          f"{spec.drafting_seconds * 1000:.1f} ms")
    assert graph_steps > 0 and spec.num_draft_tokens > 96 * 4
    assert stats.num_free_blocks == stats.num_total_blocks
    if method == "draft_model":
        # Draft and target are the same weights; in bf16 their different kernels (draft decode
        # rows, target verify rows) may round a near-tie apart.
        floor = 0.97 if dtype == "float32" else 0.85
        assert spec.num_accepted_tokens >= floor * spec.num_draft_tokens
    same = sum(g == w for g, w in zip(got, want))
    # The bounds of tests/gpu/test_spec_decode_gpu.py: verify rows and plain decodes take
    # different attention launches, so a near-tie may flip (float32: one request; bf16: more on
    # a random tiny model, 84 of 96 identical for both methods on an H200).
    assert same >= (len(want) - 1 if dtype == "float32" else int(0.75 * len(want))), same


def test_overlapped_scheduling_with_eagle3(model_path, head_path):
    prompts = _prompts(48)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    want, _, _ = _run(model_path, "float32", None, prompts, params)
    speculative = {"method": "eagle3", "model": head_path, "num_speculative_tokens": 3}
    got, stats, _ = _run(model_path, "float32", speculative, prompts, params,
                         async_scheduling=True)
    assert sum(g == w for g, w in zip(got, want)) >= len(want) - 1
    assert stats.spec_decode.num_draft_tokens > 0
