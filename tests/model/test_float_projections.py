"""`ladle quantize --float-projections`: projections kept float in every decoder layer, listed in
modules_to_not_convert, and the folder loads back to the in-memory calibrated logits."""

from __future__ import annotations

import json

import pytest
import torch

from ladle.model.layers.quant.float_projections import (
    float_ladle_modules,
    is_float_projection,
    parse_float_projections,
)


def test_parse_accepts_whole_merged_modules():
    names = parse_float_projections("q_proj, k_proj,v_proj,down_proj")
    assert names == {"q_proj", "k_proj", "v_proj", "down_proj"}
    assert float_ladle_modules(names) == {"self_attn.qkv_proj", "mlp.down_proj"}
    assert parse_float_projections("") == frozenset()
    assert is_float_projection("model.layers.3.self_attn.k_proj.weight", names)
    assert not is_float_projection("model.layers.3.self_attn.o_proj.weight", names)


@pytest.mark.parametrize(
    "text,message",
    [
        ("q_proj,k_proj", r"q_proj/k_proj/v_proj are one module in ladle.*\['v_proj'\]"),
        ("gate_proj", r"gate_proj/up_proj are one module.*\['up_proj'\]"),
        ("qkv", r"unknown projection\(s\) \['qkv'\]"),
    ],
)
def test_parse_names_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        parse_float_projections(text)


@pytest.mark.parametrize("projections", ["q_proj,k_proj,v_proj", "gate_proj,up_proj"])
def test_awq_gptq_with_float_projections_loads_to_the_in_memory_logits(tmp_path, projections):
    """The kept projections are the source's float weights, listed in modules_to_not_convert;
    AWQ folds nothing into them (a folded norm or up row would change what they compute), and
    the folder loads back to exactly the in-memory pass's logits."""
    from helpers.tiny_models import (
        install_calibrated_,
        load_float32_on_cpu,
        paged_logits,
        quantize_calibrated,
    )
    from safetensors.torch import load_file

    from ladle.model.layers.quant import get_quant_method
    from ladle.model.loader.calibration import calibrate_linears, gptq_quantizer

    load = load_float32_on_cpu
    options = ["--algorithm", "awq-gptq", "--float-projections", projections]
    float_model, out, windows = quantize_calibrated(tmp_path, "llama", "out", *options)

    kept = projections.split(",")
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    block = "self_attn" if kept[0] == "q_proj" else "mlp"
    expected = [f"model.layers.{i}.{block}.{name}" for i in (0, 1) for name in kept]
    assert sorted(config["modules_to_not_convert"]) == sorted(expected)
    written = load_file(str(out / "model.safetensors"))
    source = load_file(f"{float_model}/model.safetensors")
    for module in expected:
        assert torch.equal(written[f"{module}.weight"], source[f"{module}.weight"])
        assert f"{module}.qweight" not in written

    method = get_quant_method("int4")
    reference = load(float_model)
    float_modules = float_ladle_modules(kept)
    results = calibrate_linears(
        reference.model,
        windows,
        gptq_quantizer(method, "weighted"),
        fold_scales=True,
        float_modules=float_modules,
    )
    assert not any(name.endswith(tuple(float_modules)) for name in results)
    install_calibrated_(reference.model, method, results)
    assert torch.equal(paged_logits(load(str(out))), paged_logits(reference))


def test_cli_names_a_partial_merged_module(tmp_path, capsys):
    from helpers.tiny_models import save_tiny_model

    from ladle.cli.main import main

    float_model = save_tiny_model(tmp_path, "llama")
    out = tmp_path / "out"
    argv = ["quantize", float_model, str(out), "--method", "int4", "--float-projections", "q_proj"]
    assert main(argv) == 2
    assert "q_proj/k_proj/v_proj are one module in ladle" in capsys.readouterr().err
    assert not out.exists()
