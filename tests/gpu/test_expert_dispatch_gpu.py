"""Expert parallelism's dispatch forms over NCCL on two GPUs (distributed/expert_dispatch.py): a
tiny float32 Qwen3-MoE under `-tp 2 --enable-expert-parallel` gives the one-GPU engine's greedy
tokens with the all-to-all forced (eagerly: it is never captured), the all-reduce forced (with
graphs) and `auto` (with graphs), and auto's table is logged on rank 0.

The model runs in float32: in bf16 a tiny random MoE has near-ties everywhere (the first H200
run: exact ties of bf16 logits, and router ties that send a token to another expert, 10 of 24
requests diverging with every dispatch alike). Where a float32 run still diverges, the token two
GPUs chose must be the one GPU's runner-up within NEAR_TIE nats of its choice; a wrong expert or
a lost row moves logits by far more."""

from __future__ import annotations

import random

import pytest
import torch

from ladle import LLM, SamplingParams

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
)

NEAR_TIE = 0.01  # nats: float32 (tf32 in the fused kernels) sums in another order move ~1e-4

SHAPE = dict(
    hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    intermediate_size=512, moe_intermediate_size=128,
)  # fmt: skip


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from helpers.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("ep"), "qwen3_moe", **SHAPE)


def _run(path: str, **options) -> list[tuple[list[int], list[dict]]]:
    """Each request's greedy tokens and, per token, its top-2 logprobs {token id: logprob}."""
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 500) for _ in range(rng.randrange(1, 90))] for _ in range(24)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
    llm = LLM(path, dtype="float32", num_kv_blocks=2048, max_num_seqs=32,
              max_num_batched_tokens=512, **options)  # fmt: skip
    try:
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [
            (
                list(o.outputs[0].token_ids),
                [{t: lp.logprob for t, lp in top.items()} for top in o.outputs[0].logprobs],
            )
            for o in outputs
        ]
    finally:
        llm.engine.executor.shutdown()


def _divergences(one_gpu, split) -> list[tuple[int, float | None]]:
    """Per diverging request: (position, the one GPU's logprob gap between its token and the
    split run's token there; None when that token was not in its top 2)."""
    found = []
    for (want, want_top), (got, _) in zip(one_gpu, split, strict=True):
        position = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
        if position is None:
            continue
        top = want_top[position]
        other = top.get(got[position])
        found.append((position, None if other is None else top[want[position]] - other))
    return found


@pytest.fixture(scope="module")
def one_gpu(model_path):
    return _run(model_path)


@pytest.mark.parametrize(
    ("dispatch", "enforce_eager"), [("alltoall", True), ("allreduce", False), ("auto", False)]
)
def test_each_dispatch_gives_one_gpus_tokens(model_path, one_gpu, dispatch, enforce_eager, capfd):
    split = _run(
        model_path,
        tensor_parallel_size=2,
        enable_expert_parallel=True,
        expert_parallel_dispatch=dispatch,
        enforce_eager=enforce_eager,
    )
    divergences = _divergences(one_gpu, split)
    assert all(gap is not None and gap <= NEAR_TIE for _, gap in divergences), divergences
    assert len(divergences) < len(one_gpu), "no request matched the one GPU's tokens"
    assert f"expert-parallel dispatch ({dispatch})" in capfd.readouterr().err
