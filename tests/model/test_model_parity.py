"""ladle's Llama-family model against Hugging Face transformers on tiny random checkpoints:
every position of a flattened varlen batch over a paged cache, and chunked prefill + decode."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import PagedBatch, load_hf_reference, make_kv_caches

from ladle.attention.torch_backend import TorchAttentionBackend
from ladle.config import ModelConfig
from ladle.model.loader import load_model

PARITY_ARCHITECTURES = ["llama", "llama3_scaled", "llama_tied", "qwen2", "qwen3", "mistral"]
BLOCK_SIZE = 4
NUM_BLOCKS = 96
PROMPT_LENGTHS = [1, 4, 5, 13, 37]


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm()).item()


def _prompts(vocab_size: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def _load_ladle(path: str, dtype: torch.dtype = torch.float32):
    config = ModelConfig(model=path, dtype=dtype, device="cpu")
    return load_model(config, torch.device("cpu"), dtype, TorchAttentionBackend())


def _caches(loaded, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return make_kv_caches(loaded.arch_config, NUM_BLOCKS, BLOCK_SIZE, dtype=dtype)


@torch.no_grad()
def _hf_logits(hf_model, token_ids: list[int]) -> torch.Tensor:
    return hf_model(torch.tensor([token_ids])).logits[0].float()


@pytest.fixture(scope="module")
def models(tiny_model_path):
    """architecture -> (ladle LoadedModel, HF reference), loaded once for this module."""
    cache: dict[str, tuple] = {}

    def get(architecture: str):
        if architecture not in cache:
            path = tiny_model_path(architecture)
            cache[architecture] = (_load_ladle(path), load_hf_reference(path))
        return cache[architecture]

    return get


@pytest.mark.parametrize("architecture", PARITY_ARCHITECTURES)
@torch.no_grad()
def test_varlen_prefill_matches_hf_at_every_position(models, architecture):
    loaded, hf_model = models(architecture)
    prompts = _prompts(loaded.arch_config.vocab_size, PROMPT_LENGTHS)
    batch = PagedBatch(len(prompts), BLOCK_SIZE, NUM_BLOCKS)
    input_ids, positions, metadata = batch.step(prompts)
    hidden = loaded.model(input_ids, positions, _caches(loaded), metadata)
    logits = loaded.model.compute_logits(hidden)
    assert hidden.shape == (len(input_ids), loaded.arch_config.hidden_size)
    assert logits.dtype == torch.float32
    starts = metadata.query_start_loc_host
    for index, prompt in enumerate(prompts):
        expected = _hf_logits(hf_model, prompt)
        actual = logits[starts[index] : starts[index + 1]]
        assert relative_error(actual, expected) < 1e-4, (architecture, len(prompt))


@pytest.mark.parametrize("architecture", PARITY_ARCHITECTURES)
@torch.no_grad()
def test_chunked_prefill_then_decode_matches_hf(models, architecture):
    """Sequences prefill in 1, 2 or 3 chunks, and decode (greedy) as soon as their prompt is in,
    so steps mix prefill chunks and decodes; every row must match HF on the full sequence."""
    loaded, hf_model = models(architecture)
    prompts = _prompts(loaded.arch_config.vocab_size, [3, 9, 14, 26], seed=1)
    num_prefill_chunks = [1, 2, 3, 3]
    chunk_plans = []
    for prompt, num_chunks in zip(prompts, num_prefill_chunks, strict=True):
        bounds = [round(len(prompt) * i / num_chunks) for i in range(num_chunks + 1)]
        chunk_plans.append([prompt[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    batch = PagedBatch(len(prompts), BLOCK_SIZE, NUM_BLOCKS, seed=3)
    caches = _caches(loaded)
    tokens = [[] for _ in prompts]  # every token processed so far, per sequence
    rows = [[] for _ in prompts]  # ladle's logits for those tokens
    next_token = [None] * len(prompts)
    for step in range(6):
        chunks = []
        for index, plan in enumerate(chunk_plans):
            chunks.append(plan[step] if step < len(plan) else [next_token[index]])
        input_ids, positions, metadata = batch.step(chunks)
        logits = loaded.model.compute_logits(loaded.model(input_ids, positions, caches, metadata))
        starts = metadata.query_start_loc_host
        for index, chunk in enumerate(chunks):
            sequence_logits = logits[starts[index] : starts[index + 1]]
            tokens[index].extend(chunk)
            rows[index].append(sequence_logits)
            next_token[index] = int(sequence_logits[-1].argmax())
    for index in range(len(prompts)):
        expected = _hf_logits(hf_model, tokens[index])
        actual = torch.cat(rows[index])
        assert relative_error(actual, expected) < 1e-4, (architecture, index)
        # The decode steps' own logits, checked on their own too.
        assert relative_error(actual[-3:], expected[-3:]) < 1e-4, (architecture, index)


@torch.no_grad()
def test_bfloat16_model_stays_close_to_float32_reference(tiny_model_path):
    path = tiny_model_path("qwen3")
    loaded = _load_ladle(path, torch.bfloat16)
    assert loaded.model.model.embed_tokens.weight.dtype == torch.bfloat16
    prompts = _prompts(loaded.arch_config.vocab_size, [7, 20])
    batch = PagedBatch(len(prompts), BLOCK_SIZE, NUM_BLOCKS)
    input_ids, positions, metadata = batch.step(prompts)
    hidden = loaded.model(input_ids, positions, _caches(loaded, torch.bfloat16), metadata)
    assert hidden.dtype == torch.bfloat16
    logits = loaded.model.compute_logits(hidden)
    hf_model = load_hf_reference(path)
    starts = metadata.query_start_loc_host
    for index, prompt in enumerate(prompts):
        expected = _hf_logits(hf_model, prompt)
        assert relative_error(logits[starts[index] : starts[index + 1]], expected) < 3e-2


def test_tied_model_has_no_separate_lm_head(models):
    tied, _ = models("llama_tied")
    untied, _ = models("llama")
    assert tied.arch_config.tie_word_embeddings and tied.model.lm_head is None
    assert not any(name.startswith("lm_head") for name, _ in tied.model.named_parameters())
    assert untied.model.lm_head is not None
    hidden = torch.randn(3, tied.arch_config.hidden_size)
    expected = hidden @ tied.model.model.embed_tokens.weight.T
    torch.testing.assert_close(tied.model.compute_logits(hidden), expected)
