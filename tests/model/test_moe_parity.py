"""Qwen3-MoE and Mixtral against Hugging Face transformers (float32, CPU) on tiny random
checkpoints saved by save_pretrained: logits at every position of a paged varlen batch, and
greedy tokens through LLM(...), all at once and with chunked prefill.

Configs (tests/helpers/tiny_models.py): 'qwen3_moe' (every layer sparse, norm_topk_prob true),
'qwen3_moe_mixed' (4 layers, decoder_sparse_step 2 and mlp_only_layers [1], so only layer 3 is
sparse; norm_topk_prob false), 'mixtral'."""

from __future__ import annotations

import random

import pytest
import torch
from helpers.tiny_models import MOE_ARCHITECTURES, PagedBatch, load_hf_reference, make_kv_caches

from ladle import LLM, SamplingParams
from ladle.model.layers.moe import SparseMoeBlock
from ladle.model.models.llama import LlamaMLP

NUM_NEW_TOKENS = 10
PROMPT_LENGTHS = [1, 3, 7, 16, 17, 30]


@pytest.fixture(scope="module", params=MOE_ARCHITECTURES)
def reference(request, tiny_model_path):
    """(architecture, folder, HF model, prompts, HF's greedy continuations)."""
    path = tiny_model_path(request.param)
    hf_model = load_hf_reference(path)
    rng = random.Random(7)
    vocab_size = hf_model.config.vocab_size
    prompts = [[rng.randrange(4, vocab_size) for _ in range(n)] for n in PROMPT_LENGTHS]
    expected = [_hf_greedy(hf_model, prompt) for prompt in prompts]
    return request.param, path, hf_model, prompts, expected


@torch.no_grad()
def _hf_greedy(hf_model, prompt: list[int]) -> list[int]:
    outputs = hf_model(torch.tensor([prompt]), use_cache=True)
    generated = []
    for _ in range(NUM_NEW_TOKENS):
        generated.append(int(outputs.logits[0, -1].argmax()))
        outputs = hf_model(
            torch.tensor([[generated[-1]]]), past_key_values=outputs.past_key_values, use_cache=True
        )
    return generated


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)


def _token_ids(outputs) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in outputs]


def test_layers_are_sparse_where_the_config_says(reference):
    architecture, path, *_ = reference
    llm = LLM(path, block_size=4, num_kv_blocks=64)
    layers = llm.engine.executor.worker.model.model.layers
    kinds = [type(layer.mlp) for layer in layers]
    if architecture == "qwen3_moe_mixed":
        assert kinds == [LlamaMLP, LlamaMLP, LlamaMLP, SparseMoeBlock]
        assert layers[3].mlp.gate.norm_topk_prob is False
    else:
        assert kinds == [SparseMoeBlock] * len(layers)
        assert layers[0].mlp.gate.norm_topk_prob is True
    assert layers[-1].mlp.experts.gate_up_proj.dtype == torch.float32  # the CPU default


@torch.no_grad()
def test_varlen_prefill_logits_match_hf_at_every_position(reference):
    _, path, hf_model, prompts, _ = reference
    llm = LLM(path, block_size=4, num_kv_blocks=64)
    worker = llm.engine.executor.worker
    batch = PagedBatch(len(prompts), 4, 64)
    input_ids, positions, metadata = batch.step(prompts)
    caches = make_kv_caches(worker.arch, 64, 4)
    logits = worker.model.compute_logits(worker.model(input_ids, positions, caches, metadata))
    starts = metadata.query_start_loc_host
    for index, prompt in enumerate(prompts):
        expected = hf_model(torch.tensor([prompt])).logits[0]
        actual = logits[starts[index] : starts[index + 1]]
        error = ((actual - expected).norm() / expected.norm()).item()
        assert error < 1e-4, (index, error)


def test_greedy_tokens_match_hf_batched_and_one_by_one(reference):
    _, path, _, prompts, expected = reference
    llm = LLM(path, block_size=4, num_kv_blocks=200)
    assert _token_ids(llm.generate(prompts, _greedy(), use_tqdm=False)) == expected
    one = [_token_ids(llm.generate([p], _greedy(), use_tqdm=False))[0] for p in prompts[:3]]
    assert one == expected[:3]


def test_greedy_tokens_match_hf_with_chunked_prefill(reference):
    _, path, _, prompts, expected = reference
    # A budget of 8 tokens splits the longer prompts over several steps that also decode.
    llm = LLM(
        path,
        block_size=4,
        num_kv_blocks=200,
        max_num_batched_tokens=8,
        enable_prefix_caching=False,
    )
    assert _token_ids(llm.generate(prompts, _greedy(), use_tqdm=False)) == expected
