"""CUDA graphs must not change results: a 256-request greedy run gives identical tokens with
decode graphs on and off (the same engine code, the same bf16 kernels, only the launch differs).

It also pins that the graphs are really used: with graphs on, decode steps replay a graph.
"""

from __future__ import annotations

import random

import pytest
import torch
from helpers.tiny_models import GPU_SHAPE

from ladle import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")



def _run(path, enforce_eager: bool, prompts, max_tokens):
    llm = LLM(
        str(path),
        dtype="bfloat16",
        num_kv_blocks=4096,
        max_num_seqs=64,
        max_num_batched_tokens=1024,
        enforce_eager=enforce_eager,
    )
    replays = 0
    graphs = llm.engine.executor.worker.graphs
    if graphs is not None:
        original = graphs.run

        def counting_run(*args, **kwargs):
            nonlocal replays
            replays += 1
            return original(*args, **kwargs)

        graphs.run = counting_run
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outputs]
    del llm
    torch.cuda.empty_cache()
    return tokens, replays


def test_greedy_tokens_identical_with_and_without_graphs(tmp_path):
    from helpers.tiny_models import save_tiny_model

    path = save_tiny_model(tmp_path, "qwen3", **GPU_SHAPE)
    rng = random.Random(0)
    prompts = [[rng.randrange(4, 500) for _ in range(rng.randint(1, 200))] for _ in range(256)]
    max_tokens = [rng.randint(1, 40) for _ in range(256)]
    eager_tokens, eager_replays = _run(path, True, prompts, max_tokens)
    graph_tokens, graph_replays = _run(path, False, prompts, max_tokens)
    assert eager_replays == 0
    assert graph_replays > 0, "no decode step replayed a graph"
    for index, (eager, graph) in enumerate(zip(eager_tokens, graph_tokens)):
        assert len(eager) == max_tokens[index]
        assert graph == eager, f"request {index}: graphs changed the tokens"
