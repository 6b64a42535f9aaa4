"""Mixtures of experts on several ranks (gloo, CPU): tensor parallelism (every expert's
intermediate features split), expert parallelism (`enable_expert_parallel`: whole experts per
rank, under each token dispatch: distributed/expert_dispatch.py) and pipeline stages give HF
transformers' greedy tokens on tiny Qwen3-MoE and Mixtral; the
expert-parallel split of one layer sums, over its ranks, to the layer's output; experts the
ranks cannot split evenly are refused by name."""

from __future__ import annotations

import random

import pytest
import torch

from ladle import LLM, SamplingParams
from ladle.model.layers.moe import Routing, grouped_experts_forward, local_routing

NUM_NEW_TOKENS = 8
EP2 = dict(tensor_parallel_size=2, enable_expert_parallel=True)


def _prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(3, vocab_size) for _ in range(n)] for n in (1, 9, 33)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("architecture", "layout"),
    [
        ("qwen3_moe", dict(tensor_parallel_size=2)),
        ("qwen3_moe", dict(tensor_parallel_size=2, enable_expert_parallel=True)),
        ("mixtral", dict(tensor_parallel_size=2, enable_expert_parallel=True)),
        ("qwen3_moe_mixed", dict(pipeline_parallel_size=2)),
        ("qwen3_moe", dict(EP2, expert_parallel_dispatch="alltoall")),
        ("mixtral", dict(EP2, expert_parallel_dispatch="alltoall")),
        ("qwen3_moe", dict(EP2, expert_parallel_dispatch="auto")),
    ],
    ids=[
        "qwen3-moe-tp2", "qwen3-moe-ep2", "mixtral-ep2", "qwen3-moe-mixed-pp2",
        "qwen3-moe-ep2-alltoall", "mixtral-ep2-alltoall", "qwen3-moe-ep2-auto",
    ],  # fmt: skip
)
def test_moe_on_two_ranks_gives_hf_greedy_tokens(tiny_model_path, architecture, layout):
    from helpers.tiny_models import hf_greedy, load_hf_reference

    path = tiny_model_path(architecture)
    reference = load_hf_reference(path)
    prompts = _prompts(min(reference.config.vocab_size, 512))
    expected = [hf_greedy(reference, prompt, NUM_NEW_TOKENS) for prompt in prompts]
    llm = LLM(path, cpu_kv_cache_gib=0.02, **layout)
    try:
        params = SamplingParams(temperature=0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        assert [list(o.outputs[0].token_ids) for o in outputs] == expected
    finally:
        llm.engine.executor.shutdown()


@pytest.mark.parametrize("num_ranks", [2, 4])
def test_expert_parallel_parts_sum_to_the_layer(num_ranks):
    generator = torch.Generator().manual_seed(0)
    num_experts, hidden, intermediate, tokens, top_k = 8, 16, 12, 7, 3
    gate_up = torch.randn(num_experts, 2 * intermediate, hidden, generator=generator)
    down = torch.randn(num_experts, hidden, intermediate, generator=generator)
    x = torch.randn(tokens, hidden, generator=generator)
    scores = torch.randn(tokens, num_experts, generator=generator).softmax(-1)
    weights, ids = scores.topk(top_k, dim=-1)
    whole = grouped_experts_forward(x, weights, ids, gate_up, down)
    local = num_experts // num_ranks
    parts = 0
    for rank in range(num_ranks):
        first = rank * local
        routing = local_routing(Routing(weights, ids), first, local)
        mine = slice(first, first + local)
        parts = parts + grouped_experts_forward(
            x, routing.weights, routing.expert_ids, gate_up[mine], down[mine]
        )
    torch.testing.assert_close(parts, whole)


def test_experts_the_ranks_cannot_split_are_refused(tmp_path):
    from helpers.tiny_models import save_tiny_model

    path = save_tiny_model(tmp_path, "qwen3_moe", num_experts=6)
    with pytest.raises(ValueError, match=r"does not divide the number of experts \(6\)"):
        LLM(path, cpu_kv_cache_gib=0.02, tensor_parallel_size=4, enable_expert_parallel=True)
