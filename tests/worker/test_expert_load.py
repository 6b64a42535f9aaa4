"""Per-expert load (worker/expert_load.py): the counts the MoE layers keep on the device equal the
routing each layer actually made (an independent hook on every router), summed over layers,
from zero after start-up; /metrics exports them as one series per expert; `ladle bench`'s
summary divides them per layer and step."""

from __future__ import annotations

import re

import torch

from ladle import LLM, SamplingParams
from ladle.bench.engine_bench import expert_load_summary
from ladle.frontend.metrics import ServerMetrics
from ladle.model.layers.moe import SparseMoeBlock
from ladle.protocol.messages import SchedulerStats


def test_counts_match_the_routers_and_reach_the_metrics(tiny_model_path):
    llm = LLM(tiny_model_path("qwen3_moe"), block_size=4, num_kv_blocks=64)
    engine = llm.engine
    assert engine.get_stats().expert_token_counts == (0,) * 8  # start-up's probes not counted
    model = engine.executor.worker.model
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    routed = torch.zeros(8, dtype=torch.int64)

    def record(router, inputs, routing):
        routed.add_(torch.bincount(routing.expert_ids.reshape(-1), minlength=8))

    hooks = [block.gate.register_forward_hook(record) for block in blocks]
    prompts = [[5, 9, 13, 21, 40], [7, 3]]
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    llm.generate(prompts, params, use_tqdm=False)
    for hook in hooks:
        hook.remove()
    counts = engine.get_stats().expert_token_counts
    assert counts == tuple(routed.tolist())
    # Every computed token went to top_k experts in each of the 2 sparse layers: 7 prompt
    # tokens, then 3 more steps of 2 decodes (the first token comes with the prompt step).
    assert sum(counts) == 2 * 2 * (7 + 3 * 2)

    metrics = ServerMetrics("tiny")
    metrics.record_engine_stats(SchedulerStats(expert_token_counts=counts))
    text = metrics.render().decode()
    for expert, count in enumerate(counts):
        line = f'ladle:moe_expert_tokens_total{{expert="{expert}",model_name="tiny"}} {count}.0'
        assert line in text
    imbalance = re.search(r'ladle:moe_expert_load_imbalance\{model_name="tiny"\} (\S+)', text)
    assert float(imbalance.group(1)) == max(counts) / (sum(counts) / 8)


def test_dense_models_export_no_expert_series():
    metrics = ServerMetrics("dense")
    metrics.record_engine_stats(SchedulerStats())
    assert "moe_expert" not in metrics.render().decode()


def test_bench_summary_is_per_layer_and_step():
    summary = expert_load_summary([40, 20, 0, 20], num_layers=2, num_steps=5)
    assert summary["expert_tokens_per_step_max"] == 4.0
    assert summary["expert_tokens_per_step_min"] == 0.0
    assert summary["expert_tokens_per_step_mean"] == 2.0
    assert summary["expert_load_imbalance"] == 2.0
    assert expert_load_summary([], 2, 5) == {}
