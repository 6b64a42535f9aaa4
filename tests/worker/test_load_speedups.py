"""The start-up shortcuts change nothing but time: a lazily zeroed KV cache is zeros of the
asked shape and dtype and takes writes; a tokenizer loaded on a thread has the same end ids
as one loaded after the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ladle.config import ModelConfig
from ladle.frontend.tokenizer_preload import TokenizerPreload
from ladle.model.arch_config import ModelArchConfig
from ladle.model.tokenizer import load_tokenizer
from ladle.worker.kv_cache_alloc import zeros_lazily


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8])
def test_lazily_zeroed_cache_is_zeros(dtype) -> None:
    shape = (2, 37, 16, 3, 8)
    cache = zeros_lazily(shape, dtype, torch.device("cpu"))
    assert cache.shape == shape and cache.dtype == dtype and cache.is_contiguous()
    assert torch.equal(cache, torch.zeros(shape, dtype=dtype))
    cache[1, 36, 15] = 3
    assert cache.sum().item() == 3 * 3 * 8


def test_preloaded_tokenizer_matches_one_loaded_after_the_model(tiny_model_path) -> None:
    path = tiny_model_path("llama")
    arch = ModelArchConfig.from_hf_dict(json.loads((Path(path) / "config.json").read_text()))
    preload = TokenizerPreload(ModelConfig(model=path))
    preloaded = preload.result(path, arch)
    reference = load_tokenizer(path, arch)
    assert preloaded.eos_token_ids == reference.eos_token_ids
    assert preloaded.encode("the lazy dog") == reference.encode("the lazy dog")


def test_random_weights_of_a_preset_preload_the_default_tokenizer(tmp_path, monkeypatch) -> None:
    """A preset borrows the default model's tokenizer: preloaded when that model is cached (the
    same one resolve_tokenizer_source names after the load), else loaded after as before."""
    from ladle.frontend.tokenizer_source import resolve_tokenizer_source
    from ladle.model.default_model import default_model_if_cached
    from ladle.model.loader.presets import get_preset

    config = ModelConfig(model="tiny-llama", load_format="dummy")
    arch = ModelArchConfig.from_hf_dict(get_preset("tiny-llama"))
    if default_model_if_cached() is not None:
        preload = TokenizerPreload(config)
        assert preload._future is not None
        source = resolve_tokenizer_source(config, None)
        preloaded, reference = preload.result(None, arch), load_tokenizer(source, arch)
        assert preloaded.eos_token_ids == reference.eos_token_ids
        assert preloaded.encode("the lazy dog") == reference.encode("the lazy dog")
    monkeypatch.setenv("LADLE_CACHE_DIR", str(tmp_path / "empty"))  # not cached: no guess
    assert TokenizerPreload(config)._future is None
