"""The decode graph path, emulated on the CPU, gives the eager path's tokens.

A real CUDA graph runs only on the GPU (tests/gpu/test_cuda_graphs.py), but the host code around
it does not need one: the copies of a step into the graphs' static buffers (int64 positions and
cache slots, int32 ids converted on the copy), the padding rows of a bucket, a step whose input
ids all come from the device, and logits taken from the graph's output rows. EmulatedGraph
(helpers/emulated_graphs.py) replays the model eagerly on those buffers, so a mistake there
changes tokens here.
"""

from __future__ import annotations

import random

import pytest
from helpers.emulated_graphs import install_emulated_graphs

from ladle import LLM, SamplingParams

NUM_NEW_TOKENS = 12


def _generate(path: str, emulate_graphs: bool, async_scheduling: bool, params) -> list[list[int]]:
    llm = LLM(path, device="cpu", async_scheduling=async_scheduling, max_num_seqs=8)
    if emulate_graphs:
        install_emulated_graphs(llm.engine.executor.worker)
    rng = random.Random(5)
    vocab_size = llm.engine.vocab_size
    # Three requests: the decode steps pad to the bucket of 4; lengths end mid-block and past it.
    prompts = [[rng.randrange(4, vocab_size) for _ in range(n)] for n in (3, 16, 21)]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [output.outputs[0].token_ids for output in outputs]


@pytest.mark.parametrize("async_scheduling", [True, False])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=11, max_tokens=NUM_NEW_TOKENS, ignore_eos=True),
    ],
    ids=["greedy", "seeded"],
)
def test_emulated_graphs_give_the_eager_tokens(tiny_model_path, async_scheduling, params):
    path = tiny_model_path("qwen3")
    eager = _generate(path, False, async_scheduling, params)
    graphs = _generate(path, True, async_scheduling, params)
    assert graphs == eager
    assert all(len(tokens) == NUM_NEW_TOKENS for tokens in eager)


def test_a_batch_one_decode_step_takes_the_graph_path(tiny_model_path):
    """W3's step: one request, its input id read from the device, replayed from a graph."""
    llm = LLM(tiny_model_path("qwen3"), device="cpu", async_scheduling=True, max_num_seqs=8)
    install_emulated_graphs(llm.engine.executor.worker)
    graph = llm.engine.executor.worker.runner.graph_buckets._graphs[1]
    replays = 0
    replay = graph.replay

    def counted_replay() -> None:
        nonlocal replays
        replays += 1
        replay()

    graph.replay = counted_replay
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    llm.generate([[5, 6, 7, 8]], params, use_tqdm=False)
    assert replays == NUM_NEW_TOKENS - 1  # every decode step; the prompt step runs eagerly
