"""Pipeline parallelism over gloo on the CPU: two stages (and two stages of two tensor-parallel
ranks) give the one-process engine's results exactly, for greedy, seeded-with-penalties,
logprob, grammar and bad_words requests, with synchronous and overlapped steps; a tied LM head
on the last stage; layer splits and sizes the model cannot take are refused by name. Tensor
parallelism alone, with overlap or the fp8 KV cache, gives the one-process tokens too."""

from __future__ import annotations

import pytest

from ladle import LLM, SamplingParams
from ladle.distributed.pipeline import PipelineStage

PROMPTS = ["The capital of France is", "Once upon a time", "A person as JSON:", "Fruits:"]
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}
OPTIONS = dict(cpu_kv_cache_gib=0.02, block_size=16)


def _params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2),
        SamplingParams(temperature=0.8, seed=5, max_tokens=12, repetition_penalty=1.2),
        SamplingParams(temperature=0, max_tokens=16, structured_outputs={"json": SCHEMA}),
        SamplingParams(temperature=0, max_tokens=12, bad_words=[" apple"]),
    ]


def _results(llm: LLM):
    outputs = llm.generate(PROMPTS, _params(), use_tqdm=False)
    return [
        (
            list(o.outputs[0].token_ids),
            o.outputs[0].finish_reason,
            [sorted(entry) for entry in o.outputs[0].logprobs or []],
        )
        for o in outputs
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("architecture", "layout"),
    [
        ("llama", dict(pipeline_parallel_size=2, async_scheduling=False)),
        ("qwen3", dict(pipeline_parallel_size=2, async_scheduling=True)),
        ("llama_tied", dict(pipeline_parallel_size=2)),
        ("llama", dict(pipeline_parallel_size=2, tensor_parallel_size=2)),
    ],
    ids=["llama-pp2", "qwen3-pp2-overlap", "tied-pp2", "llama-tp2-pp2"],
)
def test_stages_give_the_one_process_results(tiny_model_path, architecture, layout):
    path = tiny_model_path(architecture)
    expected = _results(LLM(path, **OPTIONS))
    staged = LLM(path, **OPTIONS, **layout)
    try:
        assert _results(staged) == expected
        stats = staged.engine.get_stats()
        assert stats.num_free_blocks == stats.num_total_blocks
    finally:
        staged.engine.executor.shutdown()


@pytest.mark.parametrize(
    ("num_layers", "num_stages", "expected"),
    [(2, 2, [[0], [1]]), (5, 2, [[0, 1, 2], [3, 4]]), (7, 3, [[0, 1, 2], [3, 4], [5, 6]])],
)
def test_stages_split_the_layers_contiguously(num_layers, num_stages, expected):
    ranges = [
        list(PipelineStage(index=i, size=num_stages).layer_range(num_layers))
        for i in range(num_stages)
    ]
    assert ranges == expected


def test_more_stages_than_layers_is_refused(tiny_model_path):
    with pytest.raises(ValueError, match="pipeline_parallel_size=3 exceeds the model's 2 layers"):
        LLM(tiny_model_path("llama"), pipeline_parallel_size=3, **OPTIONS)


def test_a_stage_reads_only_its_own_tensors(tiny_model_path):
    """The last of two stages of the tiny (2-layer, untied) model: layer 1, the final norm and
    the LM head; never layer 0 or the embedding (the loader does not read those)."""
    import torch

    from ladle.attention.torch_backend import TorchAttentionBackend
    from ladle.distributed.tensor_parallel import SINGLE
    from ladle.model.arch_config import ModelArchConfig
    from ladle.model.loader import build_model
    from ladle.model.loader.safetensors import (
        find_safetensors_files,
        iter_safetensors_weights,
        read_hf_config,
    )

    path = tiny_model_path("llama")
    arch = ModelArchConfig.from_hf_dict(read_hf_config(path, {}))
    model = build_model(
        arch,
        torch.device("cpu"),
        torch.float32,
        TorchAttentionBackend(),
        SINGLE,
        PipelineStage(index=1, size=2),
    )
    read = [name for name, _ in iter_safetensors_weights(find_safetensors_files(path), model.holds)]
    assert read and all(
        name.startswith(("model.layers.1.", "model.norm.", "lm_head.")) for name in read
    ), read
    model.load_weights(iter_safetensors_weights(find_safetensors_files(path), model.holds))


@pytest.mark.slow
@pytest.mark.parametrize(
    "options", [dict(async_scheduling=True), dict(kv_cache_dtype="fp8")], ids=["overlap", "fp8-kv"]
)
def test_tensor_parallel_ranks_give_the_one_process_results(tiny_model_path, options):
    """Two tensor-parallel ranks (no stages) with overlapped steps, or with the fp8 KV cache,
    whose calibrated scales are the largest over the ranks' heads: the one-GPU scales."""
    path = tiny_model_path("qwen3")
    expected = _results(LLM(path, **OPTIONS, **options))
    split = LLM(path, **OPTIONS, **options, tensor_parallel_size=2)
    try:
        assert [tokens for tokens, *_ in _results(split)] == [t for t, *_ in expected]
    finally:
        split.engine.executor.shutdown()
