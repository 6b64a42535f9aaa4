"""`ladle quantize` round trips and malformed quantized checkpoints, on the CPU.

A folder written by write_quantized_checkpoint loads back (through its quantization_config) to
exactly the logits of the float model quantized in memory with the same method, for every
format; a checkpoint with a wrong scale shape, missing zeros or a bad group size fails with a
ModelLoadError that names the tensor or the config field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.tiny_models import paged_logits
from safetensors.torch import load_file, save_file

from ladle.attention.torch_backend import TorchAttentionBackend
from ladle.config import ModelConfig
from ladle.model.layers.quant import get_quant_method, quantize_linears_
from ladle.model.loader import load_model, resolve_quantization
from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.quantized_writer import write_quantized_checkpoint

CPU = torch.device("cpu")
CASES = [
    ("fp8", "hf-fp8", False),
    ("int8", "ladle", False),
    ("int4", "gptq", False),
    ("int4", "gptq", True),
    ("int4", "awq", False),
    ("int4", "awq", True),
]
# Relative error of the logits against the float model: the methods' quantization error on a
# tiny random model (weights of std 0.1), measured 0.01 (int8) to 0.33 (int4 symmetric); these
# bounds catch a broken layout (which gives errors near 1) without flaking.
LOGIT_TOLERANCE = {"fp8": 0.2, "int8": 0.05, "int4": 0.5}


def _load(path: str, **options):
    config = ModelConfig(model=path, **options)
    return load_model(config, CPU, torch.float32, TorchAttentionBackend())


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> str:
    from helpers.tiny_models import save_tiny_model

    # intermediate 200: down_proj has K = 200, two int4 groups, the second partial.
    return save_tiny_model(tmp_path_factory.mktemp("quant"), "qwen2", intermediate_size=200)


@pytest.mark.parametrize("method,fmt,symmetric", CASES)
def test_written_checkpoint_loads_to_the_in_memory_quantized_logits(
    float_model, tmp_path, method, fmt, symmetric
):
    out = tmp_path / "quantized"
    summary = write_quantized_checkpoint(float_model, out, method, fmt, torch.float32, symmetric)
    # q, k, v, o, gate, up, down in each of two layers; fp8 keeps the last layer's float.
    num_float_layers = 1 if method == "fp8" else 0
    assert summary["quantized"] == (2 - num_float_layers) * 7
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == {"hf-fp8": "fp8"}.get(fmt, fmt)
    float_modules = config["quantization_config"].get("modules_to_not_convert", [])
    assert len(float_modules) == 7 * num_float_layers
    assert all(name.startswith("model.layers.1.") for name in float_modules)
    assert (out / "tokenizer.json").is_file()

    loaded = _load(str(out))
    assert loaded.checkpoint_quantization == method
    reference = _load(float_model)
    float_logits = paged_logits(reference)
    quantize_linears_(reference.model, get_quant_method(method, symmetric=symmetric))
    in_memory = paged_logits(reference)
    assert torch.equal(paged_logits(loaded), in_memory)
    error = ((in_memory - float_logits).norm() / float_logits.norm()).item()
    assert 0 < error < LOGIT_TOLERANCE[method]


def test_quantize_command_writes_a_loadable_folder(float_model, tmp_path):
    from ladle.cli.main import main

    out = tmp_path / "awq"
    argv = ["quantize", float_model, str(out), "--method", "int4", "--format", "awq"]
    assert main(argv + ["--dtype", "float32"]) == 0
    assert _load(str(out)).checkpoint_quantization == "int4"
    assert (
        main(["quantize", float_model, str(tmp_path / "x"), "--method", "fp8", "--format", "gptq"])
        == 2
    )


def _edit(path: Path, edit) -> None:
    file = path / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


PREFIX = "model.layers.0.mlp.down_proj."


@pytest.mark.parametrize(
    "method,fmt,edit,message",
    [
        (
            "int4",
            "gptq",
            lambda t: t.update({PREFIX + "scales": t[PREFIX + "scales"][:1]}),
            "down_proj.scales",
        ),
        ("int4", "gptq", lambda t: t.pop(PREFIX + "qzeros"), "down_proj.qzeros"),
        ("int4", "awq", lambda t: t.pop(PREFIX + "qzeros"), "down_proj.qzeros"),
        (
            "int4",
            "awq",
            lambda t: t.update({PREFIX + "qzeros": t[PREFIX + "qzeros"][:, :1].contiguous()}),
            "down_proj.qzeros",
        ),
        (
            "fp8",
            "hf-fp8",
            lambda t: t.update({PREFIX + "weight_scale": t[PREFIX + "weight_scale"][:5]}),
            "down_proj.weight_scale",
        ),
        ("fp8", "hf-fp8", lambda t: t.pop(PREFIX + "weight_scale"), "down_proj.weight_scale"),
        (
            "int8",
            "ladle",
            lambda t: t.update({PREFIX + "weight_scale": t[PREFIX + "weight_scale"][:3]}),
            "down_proj.weight_scale",
        ),
    ],
)
def test_malformed_checkpoint_names_the_tensor(float_model, tmp_path, method, fmt, edit, message):
    out = tmp_path / "bad"
    write_quantized_checkpoint(float_model, out, method, fmt, torch.float32)
    _edit(out, edit)
    with pytest.raises(ModelLoadError, match=message):
        _load(str(out))


@pytest.mark.parametrize(
    "change,message",
    [
        ({"group_size": 48}, "group_size=48"),
        ({"group_size": 64}, "down_proj.scales.* expected 64"),
        ({"bits": 8}, "bits=8"),
        ({"checkpoint_format": "marlin"}, "checkpoint_format='marlin'"),
        ({"quant_method": "bitsandbytes"}, "'bitsandbytes'"),
    ],
)
def test_bad_quantization_config_is_named(float_model, tmp_path, change, message):
    out = tmp_path / "bad_config"
    write_quantized_checkpoint(float_model, out, "int4", "gptq", torch.float32)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"].update(change)
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=message):
        _load(str(out))


def test_checkpoint_method_cannot_be_overridden(float_model, tmp_path):
    out = tmp_path / "fp8"
    write_quantized_checkpoint(float_model, out, "fp8", None, torch.float32)
    with pytest.raises(ModelLoadError, match="fp8-quantized"):
        _load(str(out), quantization="int4")
    assert _load(str(out), quantization="fp8").checkpoint_quantization == "fp8"


def test_gpu_methods_resolve_on_cuda_only_by_name():
    cuda = torch.device("cuda")
    for method in ("fp8", "int8", "int4"):
        assert resolve_quantization(ModelConfig(quantization=method), "dummy", cuda) == method
    assert resolve_quantization(ModelConfig(), "safetensors", cuda) is None


def test_writer_refuses_bad_pairs(float_model, tmp_path):
    with pytest.raises(ValueError, match="holds int4 weights, not fp8"):
        write_quantized_checkpoint(float_model, tmp_path / "a", "fp8", "awq")
    with pytest.raises(ValueError, match="int4 only"):
        write_quantized_checkpoint(float_model, tmp_path / "b", "fp8", None, symmetric=True)


@pytest.mark.parametrize("fmt", ["gptq", "awq"])
def test_sharded_quantized_checkpoint_with_parts_across_files(
    float_model, tmp_path, monkeypatch, fmt
):
    import ladle.model.loader.quantized_writer as writer

    monkeypatch.setattr(writer, "SHARD_BYTES", 8 << 10)  # a projection's parts span files
    out = tmp_path / "sharded"
    write_quantized_checkpoint(float_model, out, "int4", fmt, torch.float32)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 3
    reference = _load(float_model)
    quantize_linears_(reference.model, "int4")
    assert torch.equal(paged_logits(_load(str(out))), paged_logits(reference))


def test_modules_to_not_convert_stay_float_and_merged_ones_must_be_listed_whole(
    float_model, tmp_path
):
    out = tmp_path / "int4"
    write_quantized_checkpoint(float_model, out, "int4", "gptq", torch.float32, float_layers={0})
    loaded = _load(str(out))
    assert loaded.model.get_submodule("model.layers.0.mlp.down_proj").quant_method is None
    assert loaded.model.get_submodule("model.layers.1.mlp.down_proj").quant_method is not None
    reference = _load(float_model)
    quantize_linears_(reference.model, "int4", float_layers={0})
    assert torch.equal(paged_logits(loaded), paged_logits(reference))

    config = json.loads((out / "config.json").read_text())
    listed = config["quantization_config"]["modules_to_not_convert"]
    config["quantization_config"]["modules_to_not_convert"] = [
        name for name in listed if not name.endswith("k_proj")
    ]
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="model.layers.0.self_attn.k_proj"):
        _load(str(out))


@pytest.mark.parametrize(
    "fmt,name,loads",
    [
        ("gptq", "gptq", True),
        ("gptq", "gptq_marlin", True),
        ("awq", "awq", True),
        ("awq", "awq_marlin", True),
        ("gptq", "awq", False),
        ("awq", "gptq_marlin", False),
        ("gptq", "compressed-tensors", False),
    ],
)
def test_vllm_format_names_load_that_format_only(float_model, tmp_path, fmt, name, loads):
    """vLLM users pass --quantization gptq / awq / *_marlin / compressed-tensors for a quantized
    checkpoint: ladle loads one of that format as auto would, and names the mismatch else."""
    out = tmp_path / fmt
    write_quantized_checkpoint(float_model, out, "int4", fmt, torch.float32)
    if loads:
        loaded = _load(str(out), quantization=name)
        assert loaded.checkpoint_quantization == "int4"
        assert torch.equal(paged_logits(loaded), paged_logits(_load(str(out))))
        return
    with pytest.raises(ModelLoadError, match=f"is a {fmt} checkpoint .*--quantization {name}"):
        _load(str(out), quantization=name)


@pytest.mark.parametrize("name", ["gptq", "awq_marlin", "compressed-tensors"])
def test_vllm_format_names_refuse_a_float_model(float_model, name):
    with pytest.raises(ModelLoadError, match=f"--quantization {name} loads .* is not one"):
        _load(float_model, quantization=name)


def test_gptq_v2_zeros_load_to_the_v1_logits(float_model, tmp_path):
    """GPTQModel's checkpoint_format gptq_v2 stores each zero itself where v1 stores zero - 1:
    the same weights, so the same logits, and a v2 folder read as v1 would be off by a step."""
    from ladle.model.loader.checkpoint_tensors import pack_rows, unpack_rows

    v1 = tmp_path / "v1"
    write_quantized_checkpoint(float_model, v1, "int4", "gptq", torch.float32)
    v2 = tmp_path / "v2"
    v2.mkdir()
    tensors = load_file(v1 / "model.safetensors")
    for name in [name for name in tensors if name.endswith(".qzeros")]:
        num_outputs = tensors[name.removesuffix("qzeros") + "scales"].shape[1]
        tensors[name] = pack_rows(unpack_rows(tensors[name], num_outputs).int() + 1)
    save_file(tensors, v2 / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((v1 / "config.json").read_text())
    config["quantization_config"]["checkpoint_format"] = "gptq_v2"
    (v2 / "config.json").write_text(json.dumps(config))
    for side_file in v1.iterdir():
        if side_file.name.startswith("tokenizer"):
            (v2 / side_file.name).write_bytes(side_file.read_bytes())
    assert torch.equal(paged_logits(_load(str(v2))), paged_logits(_load(str(v1))))
    config["quantization_config"]["checkpoint_format"] = "gptq"
    (v2 / "config.json").write_text(json.dumps(config))
    assert not torch.equal(paged_logits(_load(str(v2))), paged_logits(_load(str(v1))))
