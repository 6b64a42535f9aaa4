"""`ladle quantize --rotate`: the rotation folded into the residual stream leaves the float
model's function unchanged, and the rotated int4 folder loads back to the in-memory calibrated
model's logits."""

from __future__ import annotations

import json

import pytest
import torch

from ladle.model.layers.quant.rotation import random_orthogonal, rotate_residual_stream_


def test_random_orthogonal_is_orthogonal_and_seeded():
    rotation = random_orthogonal(48, seed=3)
    assert torch.allclose(rotation @ rotation.t(), torch.eye(48, dtype=torch.float64), atol=1e-12)
    assert torch.equal(rotation, random_orthogonal(48, seed=3))
    assert not torch.allclose(rotation, random_orthogonal(48, seed=4))


@pytest.mark.parametrize("architecture", ["llama", "llama_tied", "qwen2", "qwen3"])
def test_rotated_float_model_computes_the_same_logits(tmp_path, architecture):
    """Norm weights folded into the projections, the stream rotated, a tied head untied: the
    same logits (float32 rounding only), though every rotated weight changed."""
    from helpers.tiny_models import load_float32_on_cpu, paged_logits, save_tiny_model

    path = save_tiny_model(tmp_path, architecture)
    reference = load_float32_on_cpu(path)
    rotated = load_float32_on_cpu(path)
    embedding_before = rotated.model.model.embed_tokens.weight.clone()
    rotate_residual_stream_(rotated.model, seed=0)

    assert rotated.model.lm_head is not None
    assert torch.all(rotated.model.model.norm.weight == 1)
    assert not torch.allclose(rotated.model.model.embed_tokens.weight, embedding_before, atol=1e-3)
    expected, actual = paged_logits(reference), paged_logits(rotated)
    assert torch.allclose(actual, expected, atol=2e-5, rtol=1e-4), (actual - expected).abs().max()


def test_rotate_refuses_an_output_bias(tmp_path):
    from helpers.tiny_models import load_float32_on_cpu, save_tiny_model

    loaded = load_float32_on_cpu(save_tiny_model(tmp_path, "llama"))
    down = loaded.model.model.layers[0].mlp.down_proj
    down.bias = torch.nn.Parameter(torch.zeros(down.output_size), requires_grad=False)
    with pytest.raises(ValueError, match="bias on o_proj or down_proj"):
        rotate_residual_stream_(loaded.model)


@pytest.mark.parametrize("architecture", ["llama_tied", "qwen3"])
def test_rotated_awq_gptq_folder_loads_to_the_in_memory_logits(tmp_path, architecture):
    """The folder holds the rotated embedding, an untied head and unit norms (AWQ's folded
    scales where it folds them); loaded back it gives exactly the in-memory pass's logits, and
    those stay about as close to the float model's as the unrotated pass's (a wrong rotation
    would not)."""
    from helpers.tiny_models import (
        install_calibrated_,
        load_float32_on_cpu,
        paged_logits,
        quantize_calibrated,
    )
    from safetensors.torch import load_file

    from ladle.model.layers.quant import get_quant_method
    from ladle.model.loader.calibration import calibrate_linears, gptq_quantizer

    options = ["--algorithm", "awq-gptq", "--rotate", "--rotation-seed", "5"]
    float_model, out, windows = quantize_calibrated(tmp_path, architecture, "out", *options)

    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False
    written = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" in written
    assert torch.all(written["model.norm.weight"] == 1)

    method = get_quant_method("int4")
    reference = load_float32_on_cpu(float_model)
    float_logits = paged_logits(reference)
    rotate_residual_stream_(reference.model, seed=5)
    results = calibrate_linears(
        reference.model, windows, gptq_quantizer(method, "weighted"), fold_scales=True
    )
    install_calibrated_(reference.model, method, results)
    loaded = load_float32_on_cpu(str(out))
    assert loaded.model.lm_head is not None
    assert torch.equal(paged_logits(loaded), paged_logits(reference))

    def error(model) -> float:
        return ((paged_logits(model) - float_logits).norm() / float_logits.norm()).item()

    unrotated = load_float32_on_cpu(float_model)
    results = calibrate_linears(
        unrotated.model, windows, gptq_quantizer(method, "weighted"), fold_scales=True
    )
    install_calibrated_(unrotated.model, method, results)
    assert error(loaded) < 2 * error(unrotated) + 0.05, (error(loaded), error(unrotated))


def test_rotate_keeps_float_layers_rotated(tmp_path):
    """A layer left float is written from the rotated model (the source's weights would not
    fit the rotated stream): the folder matches the float model's logits as closely as the
    unrotated pass's does."""
    from helpers.tiny_models import load_float32_on_cpu, paged_logits, quantize_calibrated

    options = ["--algorithm", "gptq", "--float-last-layers", "1"]
    float_model, plain, _ = quantize_calibrated(tmp_path, "llama", "plain", *options)
    _, rotated, _ = quantize_calibrated(tmp_path, "llama", "rotated", *options, "--rotate")

    config = json.loads((rotated / "config.json").read_text())["quantization_config"]
    assert "model.layers.1.self_attn.q_proj" in config["modules_to_not_convert"]
    float_logits = paged_logits(load_float32_on_cpu(float_model))
    errors = {}
    for name, folder in (("plain", plain), ("rotated", rotated)):
        logits = paged_logits(load_float32_on_cpu(str(folder)))
        errors[name] = ((logits - float_logits).norm() / float_logits.norm()).item()
    assert errors["rotated"] < 2 * errors["plain"] + 0.05, errors


@pytest.mark.parametrize(
    "options",
    [
        ["--method", "int4", "--rotate"],  # round to nearest
        ["--method", "int4", "--algorithm", "awq", "--rotate"],
        ["--method", "fp8", "--algorithm", "gptq", "--rotate"],
    ],
)
def test_cli_refuses_rotate_without_int4_gptq(tmp_path, capsys, options):
    from helpers.tiny_models import save_tiny_model

    from ladle.cli.main import main

    float_model = save_tiny_model(tmp_path, "llama")
    out = tmp_path / "out"
    assert main(["quantize", float_model, str(out), *options]) == 2
    assert "--rotate applies to int4 with --algorithm gptq or awq-gptq" in capsys.readouterr().err
    assert not out.exists()


def test_rotate_unties_a_tied_source_that_also_stores_its_head(tmp_path):
    """Some tied checkpoints store lm_head.weight too (ladle ignores it, as transformers does).
    Rotated, the head written must be the rotated one and the config untied: the folder equals
    the one written from the same model without the stored head."""
    from helpers.tiny_models import save_tiny_model, write_calibration_text
    from safetensors.torch import load_file, save_file

    from ladle.cli.main import main

    text = write_calibration_text(tmp_path)
    folders = {}
    for name in ("plain", "with_head"):
        source = save_tiny_model(tmp_path / f"src_{name}", "llama_tied", intermediate_size=200)
        if name == "with_head":
            tensors = load_file(f"{source}/model.safetensors")
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
            save_file(tensors, f"{source}/model.safetensors", metadata={"format": "pt"})
        folders[name] = tmp_path / name
        argv = ["quantize", source, str(folders[name]), "--method", "int4", "--dtype", "float32"]
        argv += ["--algorithm", "gptq", "--rotate", "--calibration-data", str(text)]
        argv += ["--calibration-samples", "3", "--calibration-tokens", "40"]
        assert main(argv) == 0
    for folder in folders.values():
        assert json.loads((folder / "config.json").read_text())["tie_word_embeddings"] is False
    plain = load_file(str(folders["plain"] / "model.safetensors"))
    with_head = load_file(str(folders["with_head"] / "model.safetensors"))
    assert plain.keys() == with_head.keys()
    assert all(torch.equal(plain[name], with_head[name]) for name in plain)
