"""No compilation while serving: once the engine has started (graph capture and warm-up), a
W1-like run (prompts of 100-1024 tokens arriving together, chunked prefill, mixed prefill and
decode steps of every size, then decodes draining to one request) builds no Triton kernel
variant. Counted with Triton's own compile hooks (ladle.kernels.compile_log), with graphs on
and in eager mode, and across a mix of sampling features.

Why it matters: a variant built mid-run costs up to seconds in series with the GPU; before the
kernels stopped specialising on per-step values, the first W1 run in a process ran at half the
speed of the second.
"""

from __future__ import annotations

import pytest
import torch

from ladle import LLM, SamplingParams
from ladle.bench.workloads import W1, build_requests
from ladle.kernels.compile_log import compile_totals, start_compile_log

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SHAPE = dict(
    hidden_size=256,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=128,
    intermediate_size=512,
    vocab_size=16384,
    max_position_embeddings=2048,
)


def _params(index: int, seed: int, max_tokens: int) -> SamplingParams:
    """Mostly W1's (temperature 0.6, own seed), with every sampling feature mixed in."""
    common = dict(max_tokens=max_tokens, ignore_eos=True, seed=seed)
    if index % 5 == 0:
        return SamplingParams(temperature=0.0, **common)
    if index % 7 == 0:
        return SamplingParams(temperature=0.8, top_k=40, top_p=0.9, **common)
    if index % 11 == 0:
        return SamplingParams(
            temperature=0.6, repetition_penalty=1.1, presence_penalty=0.3, logprobs=3, **common
        )
    if index % 13 == 0:
        return SamplingParams(temperature=0.6, min_p=0.05, **common)
    return SamplingParams(temperature=0.6, **common)


def _counted_engine(tmp_path, **options) -> LLM:
    """A tiny bf16 engine with Triton's builds counted from before its start-up."""
    from helpers.tiny_models import save_tiny_model

    assert start_compile_log(), "Triton's compile hooks are missing: nothing can be counted"
    path = save_tiny_model(tmp_path, "qwen3", **SHAPE)
    return LLM(path, dtype="bfloat16", num_kv_blocks=4096, max_num_seqs=64, **options)


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
def test_w1_like_run_builds_no_kernel_after_start_up(tmp_path, enforce_eager):
    llm = _counted_engine(tmp_path, max_num_batched_tokens=2048, enforce_eager=enforce_eager)
    requests = build_requests(W1, 96)
    prompts = [r.prompt_token_ids for r in requests]
    params = [_params(i, r.seed, min(r.max_tokens, 48)) for i, r in enumerate(requests)]
    before = compile_totals()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    built = compile_totals().since(before)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [p.max_tokens for p in params]
    assert built.num_builds == 0, f"built while serving: {built.names}"


def test_speculative_run_with_device_drafts_builds_no_kernel_after_start_up(tmp_path):
    """Drafts made on the device (the CUDA default) at one load after another: one request,
    then 8, then 64 (a served 0.6B stalled up to ~0.45 s at each new load with them on), with
    n-gram widths that cross multiples of 16 from step to step."""
    llm = _counted_engine(tmp_path, speculative_config={
        "method": "ngram", "num_speculative_tokens": 4, "adaptive": False,
        "synthetic_acceptance": 0.6,
    })  # fmt: skip
    requests = build_requests(W1, 73)
    before = compile_totals()
    for batch in (requests[:1], requests[1:9], requests[9:]):
        prompts = [r.prompt_token_ids for r in batch]
        params = [_params(i, r.seed, min(r.max_tokens, 40)) for i, r in enumerate(batch)]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outputs] == [p.max_tokens for p in params]
    built = compile_totals().since(before)
    assert built.num_builds == 0, f"built while serving: {built.names}"


def test_compile_log_counts_a_new_variant():
    """The counter can fail: a kernel launched with a hidden size never used before builds."""
    from ladle.kernels.rms_norm import rms_norm

    assert start_compile_log()
    before = compile_totals()
    x = torch.randn(3, 97, device="cuda", dtype=torch.bfloat16)
    weight = torch.ones(97, device="cuda", dtype=torch.bfloat16)
    rms_norm(x, weight, 1e-6)
    torch.cuda.synchronize()
    built = compile_totals().since(before)
    assert built.num_builds == 1
    assert built.names == ["_rms_norm_kernel"]
