"""`ladle quantize --tune-steps`: the differentiable forward computes the serving forward's
logits, the scale gradient is autograd's, the grouped divergence is the KL of the grouped
distributions, and tuning lowers it and writes a folder that loads back to what it tuned."""

from __future__ import annotations

import pytest
import torch

from ladle.model.loader import scale_tuning
from ladle.model.loader.scale_tuning import _GroupScaledMatmul, grouped_divergence


@pytest.mark.parametrize("architecture", ["llama", "llama_tied", "qwen2", "qwen3"])
def test_sequence_logits_match_the_paged_forward(tmp_path, architecture):
    from helpers.tiny_models import load_float32_on_cpu, paged_logits, save_tiny_model

    from ladle.model.models.llama_autograd_forward import sequence_logits

    loaded = load_float32_on_cpu(save_tiny_model(tmp_path, architecture))
    paged = paged_logits(loaded)  # prompts range(4, 9) and range(20, 31), flattened
    with torch.no_grad():
        first = sequence_logits(loaded.model, torch.arange(4, 9))
        second = sequence_logits(loaded.model, torch.arange(20, 31))
    expected = torch.cat([first, second])
    assert torch.allclose(paged, expected, atol=2e-5, rtol=1e-4), (paged - expected).abs().max()


@pytest.mark.parametrize("act_order", [False, True])
def test_group_scaled_matmul_gradients_are_autograds(act_order):
    generator = torch.Generator().manual_seed(0)
    rows, inputs, group = 7, 300, 128  # K not a multiple of the group
    groups = -(-inputs // group)
    levels = torch.randint(-15, 16, (rows, inputs), generator=generator).to(torch.int8)
    column_groups = torch.arange(inputs) // group
    if act_order:
        column_groups = column_groups[torch.randperm(inputs, generator=generator)]
    scale = torch.rand(rows, groups, generator=generator) + 0.1
    x = torch.randn(2, 5, inputs, generator=generator)
    grad_output = torch.randn(2, 5, rows, generator=generator)

    x1, scale1 = x.clone().requires_grad_(True), scale.clone().requires_grad_(True)
    (_GroupScaledMatmul.apply(x1, levels, scale1, column_groups) * grad_output).sum().backward()
    x2, scale2 = x.clone().requires_grad_(True), scale.clone().requires_grad_(True)
    weight = levels.float() * scale2[:, column_groups]
    ((x2 @ weight.t()) * grad_output).sum().backward()

    assert torch.allclose(x1.grad, x2.grad, atol=1e-4)
    assert torch.allclose(scale1.grad, scale2.grad, atol=1e-3, rtol=1e-4)


def test_grouped_divergence_is_the_kl_of_the_grouped_distributions(monkeypatch):
    monkeypatch.setattr(scale_tuning, "TOP_K", 3)
    generator = torch.Generator().manual_seed(1)
    teacher_logits = torch.randn(4, 10, generator=generator) * 2
    student_logits = torch.randn(4, 10, generator=generator) * 2
    target = scale_tuning.TokenTarget(*scale_tuning._grouped(teacher_logits))

    p, q = teacher_logits.softmax(-1), student_logits.softmax(-1)
    expected = []
    for row in range(4):
        top = teacher_logits[row].topk(3).indices
        rest = torch.ones(10, dtype=torch.bool)
        rest[top] = False
        grouped_p = torch.cat([p[row, top], p[row, rest].sum()[None]])
        grouped_q = torch.cat([q[row, top], q[row, rest].sum()[None]])
        expected.append((grouped_p * (grouped_p / grouped_q).log()).sum())
    actual = grouped_divergence(student_logits, target)
    assert torch.allclose(actual, torch.stack(expected).mean(), atol=1e-6)
    assert grouped_divergence(teacher_logits, target).abs() < 1e-6


@pytest.mark.parametrize("architecture", ["llama_tied", "qwen3"])
def test_tuning_lowers_the_divergence_and_loads_back(tmp_path, architecture):
    """Two tuning steps lower the divergence from the float model on the calibration windows;
    the folder `ladle quantize --tune-steps 2` writes loads back to the in-memory tuned model's
    logits, with codes and zeros unchanged and only the scales (and norms) moved."""
    from helpers.tiny_models import load_float32_on_cpu, paged_logits, quantize_calibrated
    from safetensors.torch import load_file

    from ladle.model.layers.quant import get_quant_method
    from ladle.model.loader.calibration import calibrate_linears, gptq_quantizer
    from ladle.model.loader.scale_tuning import teacher_targets, tune_scales_
    from ladle.model.models.llama_autograd_forward import sequence_logits

    options = ["--algorithm", "gptq", "--tune-steps", "2"]
    float_model, out, windows = quantize_calibrated(tmp_path, architecture, "tuned", *options)
    _, untuned_out, _ = quantize_calibrated(
        tmp_path, architecture, "untuned", "--algorithm", "gptq"
    )

    method = get_quant_method("int4")
    model = load_float32_on_cpu(float_model)
    targets = teacher_targets(model.model, windows)
    results = calibrate_linears(model.model, windows, gptq_quantizer(method))

    def divergence() -> float:
        with torch.no_grad():
            return sum(
                grouped_divergence(sequence_logits(model.model, torch.tensor(w)), t).item()
                for w, t in zip(windows, targets, strict=True)
            )

    before = divergence()
    tune_scales_(model.model, windows, results, targets, 2, method.group_size)
    assert divergence() < before

    expected = paged_logits(model)
    actual = paged_logits(load_float32_on_cpu(out))
    assert torch.allclose(actual, expected, atol=1e-4, rtol=1e-4), (actual - expected).abs().max()

    tuned, untuned = (
        load_file(str(out / "model.safetensors")),
        load_file(str(untuned_out / "model.safetensors")),
    )
    name = "model.layers.0.mlp.down_proj"
    assert torch.equal(tuned[f"{name}.qweight"], untuned[f"{name}.qweight"])
    assert torch.equal(tuned[f"{name}.qzeros"], untuned[f"{name}.qzeros"])
    assert not torch.equal(tuned[f"{name}.scales"], untuned[f"{name}.scales"])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--method", "fp8", "--algorithm", "gptq"], "--tune-steps applies to int4"),
        (["--method", "int4"], "--tune-steps applies to int4 calibrated"),
    ],
)
def test_tune_steps_refusals(tmp_path, capsys, options, message):
    from helpers.tiny_models import save_tiny_model

    from ladle.cli import main

    out = tmp_path / "out"
    argv = ["quantize", save_tiny_model(tmp_path, "llama"), str(out), *options, "--tune-steps", "2"]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
