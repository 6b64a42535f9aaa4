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


def test_random_weights_of_a_preset_preload_the_default_tokenizer(tmp_path) -> None:
    """A preset borrows the default model's tokenizer: the thread resolves (fetches, when not
    cached) and loads the same one resolve_tokenizer_source names after the load; a folder of
    random weights preloads the folder's."""
    from ladle.frontend.tokenizer_preload import DEFAULT_MODEL_SOURCE, _source_known_before_loading
    from ladle.frontend.tokenizer_source import resolve_tokenizer_source
    from ladle.model.default_model import default_model_if_cached
    from ladle.model.loader.presets import get_preset

    config = ModelConfig(model="tiny-llama", load_format="dummy")
    assert _source_known_before_loading(config) == DEFAULT_MODEL_SOURCE
    folder = ModelConfig(model=str(tmp_path), load_format="dummy")
    assert _source_known_before_loading(folder) == str(tmp_path)
    if default_model_if_cached() is None:
        pytest.skip("the default model is not cached (the test does not fetch it)")
    arch = ModelArchConfig.from_hf_dict(get_preset("tiny-llama"))
    preload = TokenizerPreload(config)
    preloaded = preload.result(None, arch)
    reference = load_tokenizer(resolve_tokenizer_source(config, None), arch)
    assert preloaded.eos_token_ids == reference.eos_token_ids
    assert preloaded.encode("the lazy dog") == reference.encode("the lazy dog")
