"""Pre-quantized checkpoints split over two tensor-parallel ranks (gloo, CPU): an int4 GPTQ or
AWQ folder gives the one-rank engine's greedy tokens (its weights are exact slices, its
activations float); fp8 and int8 quantize activations per token, which on a row-parallel layer
is over the rank's slice of the inputs, so their results move, by no more than their own
quantization error against the float model. Groups that would straddle ranks are refused."""

from __future__ import annotations

import pytest
import torch

from ladle import LLM, SamplingParams

SHAPE = dict(hidden_size=256, head_dim=64, intermediate_size=512)  # whole int4 groups per rank
PROMPTS = [{"prompt_token_ids": list(range(3 + i, 60 + i))} for i in range(6)]


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> str:
    from helpers.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tpq"), "qwen2", **SHAPE)


def _quantized(float_model: str, folder, method: str, fmt: str) -> str:
    from ladle.model.loader.quantized_writer import write_quantized_checkpoint

    write_quantized_checkpoint(float_model, folder, method, fmt, torch.float32)
    return str(folder)


def _first_logprobs(path: str, **options) -> list[dict]:
    llm = LLM(path, cpu_kv_cache_gib=0.02, **options)
    try:
        params = SamplingParams(temperature=0, max_tokens=1, logprobs=20)
        return [o.outputs[0].logprobs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]
    finally:
        llm.engine.executor.shutdown()


def _mean_gap(reference: list[dict], other: list[dict]) -> float:
    gaps = [
        abs(ref[token].logprob - got[token].logprob)
        for ref, got in zip(reference, other)
        for token in ref
        if token in got
    ]
    return sum(gaps) / len(gaps)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_int4_folders_give_the_one_rank_tokens(float_model, tmp_path, fmt):
    path = _quantized(float_model, tmp_path / fmt, "int4", fmt)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outputs = {}
    for size in (1, 2):
        llm = LLM(path, cpu_kv_cache_gib=0.02, tensor_parallel_size=size)
        outputs[size] = [
            o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)
        ]
        llm.engine.executor.shutdown()
    assert outputs[2] == outputs[1]


@pytest.mark.slow
@pytest.mark.parametrize(("method", "fmt"), [("fp8", "hf-fp8"), ("int8", "ladle")])
def test_activation_quantized_folders_stay_within_their_own_error(
    float_model, tmp_path, method, fmt
):
    path = _quantized(float_model, tmp_path / method, method, fmt)
    reference = _first_logprobs(float_model)
    one_rank = _mean_gap(reference, _first_logprobs(path))
    two_ranks = _mean_gap(reference, _first_logprobs(path, tensor_parallel_size=2))
    assert 0 < one_rank and two_ranks < 1.5 * one_rank, (one_rank, two_ranks)


def test_int4_groups_that_would_straddle_ranks_are_refused(tmp_path):
    """down_proj's 384 inputs are three int4 groups of 128; two ranks of 192 inputs each would
    cut the middle group in two."""
    from helpers.tiny_models import save_tiny_model

    float_model = save_tiny_model(tmp_path, "qwen2", intermediate_size=384)
    path = _quantized(float_model, tmp_path / "int4", "int4", "gptq")
    with pytest.raises(ValueError, match="groups would straddle ranks"):
        LLM(path, cpu_kv_cache_gib=0.02, tensor_parallel_size=2)
