"""Loading MoE checkpoints: the config fields, the name mapping both ways, and a bad expert or
router as a ModelLoadError that names the tensor and the sizes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ladle.attention.torch_backend import TorchAttentionBackend
from ladle.config import ModelConfig
from ladle.model.arch_config import ModelArchConfig, UnsupportedModelError
from ladle.model.loader import load_model
from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.presets import get_preset

CPU = torch.device("cpu")


def _load(path: str | Path, **options):
    config = ModelConfig(model=str(path), dtype="float32", **options)
    return load_model(config, CPU, torch.float32, TorchAttentionBackend())


def _copy_with(path: str, tmp_path: Path, edit) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(path, folder)
    weights = load_file(folder / "model.safetensors")
    edit(weights)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_config_fields_and_sparse_layers():
    qwen = ModelArchConfig.from_hf_dict(get_preset("qwen3-30b-a3b"))
    assert (qwen.num_experts, qwen.num_experts_per_token, qwen.moe_intermediate_size) == (
        128,
        8,
        768,
    )
    assert qwen.norm_topk_prob and qwen.qk_norm
    assert all(qwen.is_sparse_layer(i) for i in range(qwen.num_hidden_layers))
    mixed = ModelArchConfig.from_hf_dict(
        {**get_preset("tiny-qwen3-moe"), "num_hidden_layers": 6, "decoder_sparse_step": 2,
         "mlp_only_layers": [3]}
    )
    assert [mixed.is_sparse_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    mixtral = ModelArchConfig.from_hf_dict(get_preset("mixtral-8x7b"))
    assert (mixtral.num_experts, mixtral.num_experts_per_token) == (8, 2)
    assert mixtral.moe_intermediate_size == mixtral.intermediate_size == 14336
    assert mixtral.norm_topk_prob and not mixtral.qk_norm
    dense = ModelArchConfig.from_hf_dict(get_preset("qwen3-0.6b"))
    assert dense.num_experts == 0 and not dense.is_sparse_layer(0)
    # transformers 5 saves Qwen3-MoE's num_experts under Mixtral's name.
    renamed = {**get_preset("tiny-qwen3-moe"), "num_local_experts": 4}
    del renamed["num_experts"]
    assert ModelArchConfig.from_hf_dict(renamed).num_experts == 4


def test_more_experts_per_token_than_experts_is_a_config_error(tiny_model_path, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path("mixtral"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_experts_per_tok"] = 9
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="num_experts=8, num_experts_per_tok=9"):
        _load(folder)


def test_checkpoint_names_map_both_ways(tiny_model_path):
    qwen = _load(tiny_model_path("qwen3_moe")).model
    mixtral = _load(tiny_model_path("mixtral")).model
    cases = [
        (qwen, "model.layers.1.mlp.experts.5.up_proj.weight",
         "model.layers.1.mlp.experts.gate_up_proj", (5, "up")),
        (qwen, "model.layers.0.mlp.gate.weight", "model.layers.0.mlp.gate.weight", None),
        (mixtral, "model.layers.1.block_sparse_moe.experts.7.w2.weight",
         "model.layers.1.mlp.experts.down_proj", (7, "down")),
        (mixtral, "model.layers.0.block_sparse_moe.experts.0.w3.weight",
         "model.layers.0.mlp.experts.gate_up_proj", (0, "up")),
        (mixtral, "model.layers.0.block_sparse_moe.gate.weight",
         "model.layers.0.mlp.gate.weight", None),
        (mixtral, "model.layers.0.self_attn.k_proj.weight",
         "model.layers.0.self_attn.qkv_proj.weight", "k"),
    ]
    for model, checkpoint_name, param_name, shard in cases:
        assert model.to_param_name(checkpoint_name) == (param_name, shard)
        assert model.to_checkpoint_name(param_name, shard) == checkpoint_name


def test_stacked_experts_hold_each_experts_tensors(tiny_model_path):
    path = tiny_model_path("mixtral")
    weights = load_file(Path(path) / "model.safetensors")
    experts = _load(path).model.model.layers[1].mlp.experts
    prefix = "model.layers.1.block_sparse_moe.experts.6."
    gate, up = experts.gate_up_proj[6].split(experts.intermediate_size)
    assert torch.equal(gate, weights[prefix + "w1.weight"])
    assert torch.equal(up, weights[prefix + "w3.weight"])
    assert torch.equal(experts.down_proj[6], weights[prefix + "w2.weight"])


QWEN_EXPERT = "model.layers.1.mlp.experts.3."
MIXTRAL_EXPERT = "model.layers.0.block_sparse_moe.experts.2."


@pytest.mark.parametrize(
    ("architecture", "edit", "message"),
    [
        (
            "qwen3_moe",
            lambda w: w.pop(QWEN_EXPERT + "up_proj.weight"),
            rf"missing 1 weight\(s\): {QWEN_EXPERT}up_proj.weight",
        ),
        (
            "mixtral",
            lambda w: w.pop(MIXTRAL_EXPERT + "w2.weight"),
            rf"missing 1 weight\(s\): {MIXTRAL_EXPERT}w2.weight",
        ),
        (
            "qwen3_moe",
            lambda w: w.update({QWEN_EXPERT + "gate_proj.weight": torch.zeros(32, 63)}),
            rf"'{QWEN_EXPERT}gate_proj.weight': expert 3's gate projection has shape \(32, 63\);"
            r" the config \(hidden_size=64, expert intermediate size=32\) needs \(32, 64\)",
        ),
        (
            "mixtral",
            lambda w: w.update({MIXTRAL_EXPERT + "w2.weight": torch.zeros(64, 31)}),
            rf"'{MIXTRAL_EXPERT}w2.weight': expert 2's down projection has shape \(64, 31\);"
            r" .* needs \(64, 32\)",
        ),
        (
            "qwen3_moe",
            lambda w: w.update({"model.layers.0.mlp.gate.weight": torch.zeros(6, 64)}),
            r"'model.layers.0.mlp.gate.weight': router of shape \(6, 64\) does not fit the "
            r"config's \(num_experts=8, hidden_size=64\): expected \(8, 64\)",
        ),
        (
            "mixtral",
            lambda w: w.update({"model.layers.1.block_sparse_moe.gate.weight": torch.zeros(8, 60)}),
            r"'model.layers.1.block_sparse_moe.gate.weight': router of shape \(8, 60\)",
        ),
        (
            "qwen3_moe",
            lambda w: w.update({"model.layers.0.mlp.experts.8.up_proj.weight": w.pop(
                "model.layers.0.mlp.experts.7.up_proj.weight")}),
            r"'model.layers.0.mlp.experts.8.up_proj.weight' is for expert 8, but the config has "
            r"num_experts=8",
        ),
        (
            "mixtral",
            lambda w: w.pop("model.layers.1.block_sparse_moe.gate.weight"),
            r"missing 1 weight\(s\): model.layers.1.block_sparse_moe.gate.weight",
        ),
    ],
    ids=[
        "missing-qwen-expert",
        "missing-mixtral-expert",
        "misshapen-qwen-expert",
        "misshapen-mixtral-expert",
        "qwen-router-too-few-experts",
        "mixtral-router-wrong-hidden",
        "expert-beyond-config",
        "missing-router",
    ],
)
def test_bad_expert_or_router_is_named(tiny_model_path, tmp_path, architecture, edit, message):
    folder = _copy_with(tiny_model_path(architecture), tmp_path, edit)
    with pytest.raises(ModelLoadError, match=message) as error:
        _load(folder)
    assert str(folder) in str(error.value)


def test_dummy_moe_presets_run_and_fill_the_experts():
    loaded = load_model(
        ModelConfig(model="tiny-qwen3-moe", load_format="dummy", seed=3),
        CPU,
        torch.float32,
        TorchAttentionBackend(),
    )
    experts = loaded.model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.std().item() == pytest.approx(0.02, rel=0.1)
    assert loaded.arch_config.architecture == "Qwen3MoeForCausalLM"


def test_quantize_refuses_a_mixture_of_experts(tiny_model_path, tmp_path, capsys):
    """Until experts have a quantized layout ladle loads, `ladle quantize` says so instead of
    writing a folder that does not load back, with and without calibration."""
    from helpers.tiny_models import write_calibration_text

    from ladle.cli.main import main

    path = tiny_model_path("qwen3_moe")
    text = str(write_calibration_text(tmp_path))
    calibrated = ["--method", "int4", "--algorithm", "gptq", "--calibration-data", text]
    calibrated += ["--calibration-samples", "1", "--calibration-tokens", "40"]
    for name, options in [("rtn", ["--method", "int8"]), ("gptq", calibrated)]:
        assert main(["quantize", path, str(tmp_path / name), *options]) != 0
        assert "does not quantize mixtures of experts" in capsys.readouterr().err
        assert not (tmp_path / name).exists()


def test_a_non_fp8_quantized_moe_checkpoint_is_refused_by_name(tiny_model_path, tmp_path):
    """fp8 experts load (tests/model/test_moe_fp8.py); other quantized experts do not."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path("mixtral"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "ladle", "method": "int8"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="int8-quantized MixtralForCausalLM"):
        _load(folder)
