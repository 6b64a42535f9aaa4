"""load_model: safetensors folders (sharded or not), dummy presets, and every failure mode."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.tiny_models import PagedBatch, make_kv_caches
from safetensors.torch import load_file, save_file

from ladle.attention.torch_backend import TorchAttentionBackend
from ladle.config import ModelConfig
from ladle.model.arch_config import ModelArchConfig, UnsupportedModelError
from ladle.model.loader import LoadedModel, load_model
from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.presets import PRESETS
from ladle.model.models.registry import get_model_class

CPU = torch.device("cpu")


def _load(model: str | None, **options) -> LoadedModel:
    dtype = options.pop("torch_dtype", torch.float32)
    return load_model(ModelConfig(model=model, **options), CPU, dtype, TorchAttentionBackend())


def _copy(path: str, tmp_path: Path) -> Path:
    target = tmp_path / "model"
    shutil.copytree(path, target)
    return target


def _state(loaded: LoadedModel) -> dict[str, torch.Tensor]:
    return {name: param.detach() for name, param in loaded.model.named_parameters()}


@torch.no_grad()
def _forward(loaded: LoadedModel, lengths=(3, 6)) -> torch.Tensor:
    dtype = next(loaded.model.parameters()).dtype
    prompts = [list(range(4, 4 + n)) for n in lengths]
    input_ids, positions, metadata = PagedBatch(len(prompts), 4, 16).step(prompts)
    caches = make_kv_caches(loaded.arch_config, 16, 4, dtype=dtype)
    return loaded.model.compute_logits(loaded.model(input_ids, positions, caches, metadata))


def test_sharded_checkpoint_loads_the_same_weights(tiny_model_path):
    sharded_path = tiny_model_path("qwen2", sharded=True)
    assert (Path(sharded_path) / "model.safetensors.index.json").is_file()
    assert len(list(Path(sharded_path).glob("*.safetensors"))) > 1
    sharded, single = _load(sharded_path), _load(tiny_model_path("qwen2"))
    assert sharded.source == "safetensors" and sharded.model_path == sharded_path
    assert sharded.arch_config == single.arch_config
    for name, tensor in _state(single).items():
        torch.testing.assert_close(_state(sharded)[name], tensor, rtol=0, atol=0)


def test_loaded_model_metadata(tiny_model_path):
    loaded = _load(tiny_model_path("llama"), torch_dtype=torch.bfloat16)
    assert loaded.arch_config.architecture == "LlamaForCausalLM"
    assert not loaded.model.training
    assert all(p.dtype == torch.bfloat16 for p in loaded.model.parameters())
    assert loaded.model.model.rotary_emb.cos_sin_cache.device == CPU
    assert torch.isfinite(_forward(loaded)).all()


def test_hf_overrides_are_merged_before_parsing(tiny_model_path):
    loaded = _load(tiny_model_path("llama"), hf_overrides={"rms_norm_eps": 1e-3})
    assert loaded.arch_config.rms_norm_eps == 1e-3
    # Fewer layers than the checkpoint holds: the surplus layer's weights are unexpected.
    with pytest.raises(ModelLoadError, match="unexpected weight 'model.layers.1"):
        _load(tiny_model_path("llama"), hf_overrides={"num_hidden_layers": 1})


def test_missing_path():
    with pytest.raises(ModelLoadError, match="/no/such/model.*does not exist"):
        _load("/no/such/model")


def test_preset_name_without_dummy_format_hints_at_dummy():
    with pytest.raises(ModelLoadError, match="load_format='dummy'"):
        _load("qwen3-0.6b")


def test_folder_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="has no config.json"):
        _load(str(tmp_path))


def test_folder_without_safetensors(tiny_model_path, tmp_path):
    shutil.copy(Path(tiny_model_path("llama")) / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        _load(str(tmp_path))


def test_truncated_safetensors_file(tiny_model_path, tmp_path):
    folder = _copy(tiny_model_path("llama"), tmp_path)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors.*truncated or corrupt"):
        _load(str(folder))


def test_corrupt_safetensors_header(tiny_model_path, tmp_path):
    folder = _copy(tiny_model_path("llama"), tmp_path)
    (folder / "model.safetensors").write_bytes(b"\x00not a safetensors file at all")
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        _load(str(folder))


def test_shard_index_naming_a_missing_file(tiny_model_path, tmp_path):
    folder = _copy(tiny_model_path("llama", sharded=True), tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    missing = sorted(set(index["weight_map"].values()))[-1]
    (folder / missing).unlink()
    with pytest.raises(ModelLoadError, match=missing):
        _load(str(folder))


def test_unsupported_architecture(tiny_model_path, tmp_path):
    folder = _copy(tiny_model_path("llama"), tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel") as error:
        _load(str(folder))
    assert str(folder) in str(error.value) and isinstance(error.value, ValueError)
    with pytest.raises(UnsupportedModelError):
        get_model_class("GPT2LMHeadModel")


def test_max_model_len_beyond_max_position_embeddings(tiny_model_path):
    assert _load(tiny_model_path("llama"), max_model_len=512).arch_config
    with pytest.raises(ModelLoadError, match="max_model_len=513 exceeds.*512"):
        _load(tiny_model_path("llama"), max_model_len=513)


def _rewrite_weights(folder: Path, edit) -> None:
    weights = load_file(folder / "model.safetensors")
    edit(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda w: w.pop("model.layers.1.self_attn.v_proj.weight"),
            r"missing 1 weight\(s\): model.layers.1.self_attn.v_proj.weight",
        ),
        (lambda w: w.pop("lm_head.weight"), r"missing 1 weight\(s\): lm_head.weight"),
        (
            lambda w: w.update({"model.layers.0.mlp.extra.weight": torch.zeros(2)}),
            "unexpected weight 'model.layers.0.mlp.extra.weight'",
        ),
        (
            lambda w: w.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(128, 63)}),
            r"'model.layers.0.mlp.up_proj.weight': shape \(128, 63\) does not fit \(128, 64\)",
        ),
        (
            lambda w: w.update({"model.norm.weight": torch.zeros(65)}),
            r"'model.norm.weight': shape \(65,\) does not fit \(64,\)",
        ),
    ],
    ids=["missing-shard", "missing-lm-head", "unexpected", "wrong-shape-merged", "wrong-shape"],
)
def test_bad_weights_are_named(tiny_model_path, tmp_path, edit, message):
    folder = _copy(tiny_model_path("llama"), tmp_path)
    _rewrite_weights(folder, edit)
    with pytest.raises(ModelLoadError, match=message) as error:
        _load(str(folder))
    assert str(folder) in str(error.value)


def test_ignores_rotary_inv_freq_and_redundant_tied_lm_head(tiny_model_path, tmp_path):
    folder = _copy(tiny_model_path("llama_tied"), tmp_path)

    def add_extras(weights):
        weights["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()

    _rewrite_weights(folder, add_extras)
    assert _load(str(folder)).model.lm_head is None


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_parse(name):
    config = ModelArchConfig.from_hf_dict(PRESETS[name])
    assert config.num_attention_heads % config.num_key_value_heads == 0


def test_preset_shapes_of_known_models():
    qwen3 = ModelArchConfig.from_hf_dict(PRESETS["qwen3-0.6b"])
    assert (qwen3.hidden_size, qwen3.num_hidden_layers, qwen3.head_dim, qwen3.qk_norm) == (
        1024,
        28,
        128,
        True,
    )
    llama = ModelArchConfig.from_hf_dict(PRESETS["llama-3.1-8b"])
    assert llama.rope_scaling["rope_type"] == "llama3" and llama.num_key_value_heads == 8
    assert ModelArchConfig.from_hf_dict(PRESETS["qwen2.5-0.5b"]).attention_bias


def test_dummy_preset_is_seeded_and_runs_in_bfloat16():
    options = dict(load_format="dummy", hf_overrides={"num_hidden_layers": 2})
    first = _load("smollm2-135m", seed=1, torch_dtype=torch.bfloat16, **options)
    again = _load("smollm2-135m", seed=1, torch_dtype=torch.bfloat16, **options)
    other = _load("smollm2-135m", seed=2, torch_dtype=torch.bfloat16, **options)
    assert first.source == "dummy" and first.model_path is None
    assert first.arch_config.num_hidden_layers == 2 and first.arch_config.vocab_size == 49152
    name = "model.layers.1.mlp.down_proj.weight"
    assert torch.equal(_state(first)[name], _state(again)[name])
    assert not torch.equal(_state(first)[name], _state(other)[name])
    assert torch.isfinite(_forward(first)).all()


def test_dummy_from_local_folder_uses_its_config(tiny_model_path):
    path = tiny_model_path("qwen3")
    loaded = _load(path, load_format="dummy")
    assert loaded.source == "dummy" and loaded.model_path == path
    assert loaded.arch_config == _load(path).arch_config
    assert torch.isfinite(_forward(loaded)).all()


def test_unknown_dummy_preset():
    with pytest.raises(ModelLoadError, match="neither a preset"):
        _load("no-such-preset", load_format="dummy")
