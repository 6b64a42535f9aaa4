"""Prefill graphs (worker/prefill_graphs.py) must give what the eager step gives.

Small steps with prompt tokens replay a padded graph: one fresh prompt, a prompt whose prefix is
cached beside a short one, and a prompt arriving while another request decodes (so the step mixes
a decode with a prefill). Each is run with graphs on and off (enforce_eager); every prompt
token's logprob (the graph's hidden states of all real rows) and the greedy tokens are compared,
and the graphs must really have been replayed for the steps with prompt tokens.
"""

from __future__ import annotations

import random

import pytest
import torch
from helpers.tiny_models import GPU_SHAPE

from ladle import LLM, SamplingParams
from ladle.protocol.messages import EngineCoreRequest

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# bf16 logprobs of the same model differ by GEMM tile choice (a padded step may pick another).
LOGPROB_ATOL = 0.05


def _prompt_logprobs(output) -> list[float]:
    entries = output.prompt_logprobs[1:]
    return [entry[token].logprob for entry, token in zip(entries, output.prompt_token_ids[1:])]


def _engine_run(llm, prompts_by_step: list[list[list[int]]], max_tokens: int) -> dict[str, list]:
    """Add each group of prompts before one engine step; run to the end; tokens per request."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    tokens: dict[str, list[int]] = {}
    for group_index, group in enumerate(prompts_by_step):
        for index, prompt in enumerate(group):
            request_id = f"g{group_index}-{index}"
            tokens[request_id] = []
            engine.add_request(
                EngineCoreRequest(
                    request_id=request_id, prompt_token_ids=prompt, sampling_params=params
                )
            )
        for output in engine.step():
            tokens[output.request_id] += output.new_token_ids
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens[output.request_id] += output.new_token_ids
    return tokens


def _run(path, enforce_eager: bool):
    llm = LLM(
        str(path),
        dtype="bfloat16",
        num_kv_blocks=2048,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        enforce_eager=enforce_eager,
    )
    replays = 0
    graphs = llm.engine.executor.worker.graphs
    if graphs is not None:
        assert graphs.prefill is not None and graphs.num_prefill_graphs > 0
        original = graphs.prefill.run

        def counting_run(*args, **kwargs):
            nonlocal replays
            replays += 1
            return original(*args, **kwargs)

        graphs.prefill.run = counting_run
    rng = random.Random(0)
    long_prompt = [rng.randrange(4, 500) for _ in range(300)]
    shared = [rng.randrange(4, 500) for _ in range(200)]
    cached_then_new = shared[:160] + [rng.randrange(4, 500) for _ in range(40)]
    short = [rng.randrange(4, 500) for _ in range(5)]
    # Every prompt token's logprob: all rows of the graph's hidden states (such requests skip
    # the prefix cache, so the cached case below compares its first token's logprob instead).
    with_prompt_logprobs = SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=0
    )
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)
    fresh = llm.generate([long_prompt], with_prompt_logprobs, use_tqdm=False)[0]
    llm.generate([shared], params, use_tqdm=False)  # fills the prefix cache
    # A 160-token cached prefix plus 40 new tokens, beside a 5-token prompt, in one step.
    results = llm.generate([cached_then_new, short], params, use_tqdm=False)
    # The second prompt arrives while the first decodes: a step of one decode and one prefill.
    mixed = _engine_run(llm, [[long_prompt[:50]], [long_prompt[50:170]]], max_tokens=6)
    logprobs = [_prompt_logprobs(fresh)] + [
        [r.outputs[0].logprobs[0][r.outputs[0].token_ids[0]].logprob] for r in results
    ]
    tokens = [fresh.outputs[0].token_ids] + [r.outputs[0].token_ids for r in results]
    tokens += [mixed[k] for k in sorted(mixed)]
    cached = [r.num_cached_tokens for r in results]
    del llm
    torch.cuda.empty_cache()
    return logprobs, tokens, cached, replays


def test_prefill_graphs_match_eager_steps(tmp_path):
    from helpers.tiny_models import save_tiny_model

    path = save_tiny_model(tmp_path, "qwen3", **GPU_SHAPE)
    eager_logprobs, eager_tokens, eager_cached, eager_replays = _run(path, True)
    graph_logprobs, graph_tokens, graph_cached, graph_replays = _run(path, False)
    assert eager_replays == 0
    # Four steps with prompt tokens at least: the fresh prompt, the cached pair, the mixed pair.
    assert graph_replays >= 4, f"only {graph_replays} prefill steps replayed a graph"
    assert graph_cached == eager_cached and graph_cached[0] == 160
    for index, (eager, graph) in enumerate(zip(eager_logprobs, graph_logprobs)):
        assert len(graph) == len(eager) > 0
        difference = max(abs(a - b) for a, b in zip(eager, graph))
        assert difference < LOGPROB_ATOL, f"prompt {index}: logprobs differ by {difference}"
    for index, (eager, graph) in enumerate(zip(eager_tokens, graph_tokens)):
        assert len(graph) == 6
        assert graph == eager, f"request {index}: prefill graphs changed the tokens"
