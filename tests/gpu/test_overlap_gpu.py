"""Overlapped scheduling must not change results on CUDA: a 256-request greedy run gives
identical tokens with overlap on and off, with decode graphs on and off; seeded random rows and
rows that stop mid-flight give the same outputs too. It also pins that the overlap is real: with
it on, decode steps read their input ids from the device (the host has not seen them yet).
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from helpers.tiny_models import GPU_SHAPE

from ladle import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")



def _engine(path, async_scheduling: bool, enforce_eager: bool) -> LLM:
    return LLM(
        str(path),
        dtype="bfloat16",
        num_kv_blocks=4096,
        max_num_seqs=64,
        max_num_batched_tokens=1024,
        enforce_eager=enforce_eager,
        async_scheduling=async_scheduling,
    )


def _outputs(llm: LLM, prompts, params) -> tuple[list, int]:
    """(token ids, finish reason) per request, and how many steps read input ids on the device."""
    builder = llm.engine.executor.worker.runner.input_builder
    original = builder.build
    device_reads = 0

    def counting_build(*args, **kwargs):
        nonlocal device_reads
        inputs = original(*args, **kwargs)
        device_reads += inputs.token_slots is not None
        return inputs

    builder.build = counting_build
    outputs = llm.generate(prompts, params, use_tqdm=False)
    builder.build = original
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outputs], device_reads


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from helpers.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("overlap"), "qwen3", **GPU_SHAPE)


def test_greedy_tokens_identical_with_overlap_on_and_off(model_path):
    rng = random.Random(0)
    prompts = [[rng.randrange(4, 500) for _ in range(rng.randint(1, 200))] for _ in range(256)]
    max_tokens = [rng.randint(1, 40) for _ in range(256)]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    results = {}
    for async_scheduling in (False, True):
        for enforce_eager in (False, True):
            llm = _engine(model_path, async_scheduling, enforce_eager)
            assert llm.engine.overlaps == async_scheduling
            results[async_scheduling, enforce_eager] = _outputs(llm, prompts, params)
            del llm
            torch.cuda.empty_cache()
    reference, reads = results[False, True]
    assert reads == 0
    assert [len(tokens) for tokens, _ in reference] == max_tokens
    for key, (outputs, device_reads) in results.items():
        assert device_reads > 0 if key[0] else device_reads == 0, key
        for index, (got, want) in enumerate(zip(outputs, reference)):
            assert got == want, f"request {index}: async_scheduling, enforce_eager = {key}"


def test_sampled_and_stopping_rows_identical_with_overlap_on_and_off(model_path):
    rng = random.Random(1)
    prompts = [[rng.randrange(4, 500) for _ in range(rng.randint(5, 100))] for _ in range(48)]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    synchronous = _engine(model_path, False, False)
    plain, _ = _outputs(synchronous, prompts, greedy)
    params = []
    for index, (tokens, _) in enumerate(plain):
        if index % 3 == 0:  # stops on its 6th greedy token: its next step is already in flight
            params.append(
                SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[tokens[5]])
            )
        elif index % 3 == 1:
            params.append(SamplingParams(temperature=0.8, top_k=20, seed=index, max_tokens=24))
        else:
            params.append(SamplingParams(temperature=0.7, seed=index, max_tokens=20, logprobs=3))
    del synchronous
    torch.cuda.empty_cache()
    # A fresh engine for each side: a second run on the same engine would hit the prefix cache,
    # and a cached prompt's first token comes from another launch than a prefill's.
    synchronous = _engine(model_path, False, False)
    want, _ = _outputs(synchronous, prompts, params)
    del synchronous
    torch.cuda.empty_cache()
    got, device_reads = _outputs(_engine(model_path, True, False), prompts, params)
    assert device_reads > 0
    assert got == want
    assert all(want[i][1] == "stop" for i in range(0, 48, 3))


def test_sampled_token_logprob_alone_matches_a_top_k_request(model_path):
    """`logprobs: 0` (every token-id stream of `ladle bench serve`) on the overlapped graph path:
    kernels/sampled_logprob.py and the runner's one packed copy of the logprob tensors give the
    seeded tokens of a request without logprobs, and the sampled token's rank and logprob (to
    float32 rounding: the torch path's log-softmax sums in another order) that a top-3 request
    reports."""
    rng = random.Random(2)
    prompts = [[rng.randrange(4, 500) for _ in range(rng.randint(5, 300))] for _ in range(6)]
    # No prefix cache: a cached prompt's first token comes from another launch than a prefill's.
    llm = LLM(
        str(model_path), dtype="bfloat16", num_kv_blocks=4096, max_num_seqs=64,
        max_num_batched_tokens=1024, async_scheduling=True, enable_prefix_caching=False,
    )

    def run(num_logprobs):
        params = [
            SamplingParams(temperature=0.6, seed=index, max_tokens=16, ignore_eos=True,
                           logprobs=num_logprobs)
            for index in range(len(prompts))
        ]
        return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]

    plain, alone, top = run(None), run(0), run(3)
    for without, only, with_top in zip(plain, alone, top):
        assert only.token_ids == without.token_ids == with_top.token_ids
        for token_id, entry, top_entry in zip(only.token_ids, only.logprobs, with_top.logprobs):
            assert list(entry) == [token_id]
            assert entry[token_id].rank == top_entry[token_id].rank
            assert math.isclose(entry[token_id].logprob, top_entry[token_id].logprob,
                                rel_tol=1e-6, abs_tol=2e-6)
