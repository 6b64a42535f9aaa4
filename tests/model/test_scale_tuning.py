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
        (["--method", "int8"], "--tune-steps applies to int4 and fp8"),
        (["--method", "int4"], "--tune-steps applies to int4 calibrated"),
        (["--method", "fp8", "--float-last-layers", "99"], "no quantized projection to tune"),
    ],
)
def test_tune_steps_refusals(tmp_path, capsys, options, message):
    from helpers.tiny_models import save_tiny_model, write_calibration_text

    from ladle.cli.main import main

    out = tmp_path / "out"
    argv = ["quantize", save_tiny_model(tmp_path, "llama"), str(out), *options, "--tune-steps", "2"]
    # The last case gets as far as the tuning: calibration text that needs no download.
    argv += ["--calibration-data", str(write_calibration_text(tmp_path))]
    argv += ["--calibration-samples", "3", "--calibration-tokens", "40"]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_fp8_input_rounding_is_the_engines_and_passes_the_gradient_straight():
    from ladle.kernels.per_token_rule import per_token_quant_reference
    from ladle.model.layers.quant.fp8 import FP8_DTYPE

    x = (torch.randn(2, 5, 48, generator=torch.Generator().manual_seed(3)) * 3).requires_grad_()
    rounded = scale_tuning._rounded_per_token(x)
    codes, scale = per_token_quant_reference(x.detach().reshape(10, 48), FP8_DTYPE)
    assert torch.equal(rounded.detach(), (codes.float() * scale).reshape(2, 5, 48))
    assert not torch.equal(rounded.detach(), x.detach())
    weights = torch.randn(2, 5, 48)
    (rounded * weights).sum().backward()
    assert torch.equal(x.grad, weights)


@pytest.mark.parametrize("architecture", ["llama_tied", "qwen3"])
def test_fp8_differentiable_forward_is_the_engines_w8a8(tmp_path, architecture):
    """With every projection in fp8 (weights and per-token inputs), the forward the tuning
    differentiates computes the logits the engine's fp8 layers do on a folder ladle wrote."""
    from helpers.tiny_models import load_float32_on_cpu, paged_logits, save_tiny_model

    from ladle.cli.main import main
    from ladle.model.layers.quant import get_quant_method
    from ladle.model.loader.calibration import round_linears_
    from ladle.model.models.llama_autograd_forward import sequence_logits

    float_model = save_tiny_model(tmp_path, architecture, intermediate_size=200)
    out = tmp_path / "fp8"
    argv = ["quantize", float_model, str(out), "--method", "fp8", "--dtype", "float32"]
    assert main([*argv, "--float-last-layers", "0"]) == 0
    paged = paged_logits(load_float32_on_cpu(out))

    model = load_float32_on_cpu(float_model).model
    results = round_linears_(model, get_quant_method("fp8"), (), ())
    overrides = {name: scale_tuning._TunedLinear.fp8(c, "cpu") for name, c in results.items()}
    with torch.no_grad():
        first = sequence_logits(model, torch.arange(4, 9), overrides)
        second = sequence_logits(model, torch.arange(20, 31), overrides)
    expected = torch.cat([first, second])
    assert torch.allclose(paged, expected, atol=1e-4, rtol=1e-4), (paged - expected).abs().max()
    # The model now holds the dequantized weights, so this differs by the inputs' rounding alone.
    unrounded = torch.cat(
        [sequence_logits(model, torch.arange(4, 9)), sequence_logits(model, torch.arange(20, 31))]
    )
    assert not torch.allclose(paged, unrounded.detach(), atol=1e-3, rtol=1e-3)


def test_fp8_tuning_moves_only_the_scales_and_norms_toward_the_float_model(tmp_path):
    """`ladle quantize --method fp8 --tune-steps 8`: the same e4m3 codes as round to nearest, other
    scales and norms, the engine's W8A8 logits of the loaded folder closer (in KL) to the float
    model's on the calibration windows than the untuned folder's, and equal to the logits of
    the same tuning done in memory."""
    from helpers.tiny_models import load_float32_on_cpu, paged_logits, quantize_calibrated
    from safetensors.torch import load_file

    from ladle.model.layers.quant import get_quant_method
    from ladle.model.loader.calibration import round_linears_
    from ladle.model.models.llama_autograd_forward import sequence_logits

    options = ("--float-last-layers", "0")
    float_model, tuned_out, windows = quantize_calibrated(
        tmp_path, "qwen2", "tuned", *options, "--tune-steps", "8", method="fp8"
    )
    _, plain_out, _ = quantize_calibrated(tmp_path, "qwen2", "plain", *options, method="fp8")

    def divergence(folder) -> float:
        logits = paged_logits(load_float32_on_cpu(folder), prompts=windows)
        return torch.nn.functional.kl_div(
            logits.log_softmax(-1),
            reference.log_softmax(-1),
            log_target=True,
            reduction="batchmean",
        ).item()

    reference = paged_logits(load_float32_on_cpu(float_model), prompts=windows)
    assert divergence(tuned_out) < divergence(plain_out)

    # The same tuning in memory: the folder serves the logits of what was tuned.
    model = load_float32_on_cpu(float_model).model
    targets = scale_tuning.teacher_targets(model, windows)
    results = round_linears_(model, get_quant_method("fp8"), (), ())
    scale_tuning.tune_scales_(model, windows, results, targets, 8, None)
    tuned_linears = {  # the norms are in the model and in `results` as {"float": ...}
        name: scale_tuning._TunedLinear.fp8(canonical, "cpu")
        for name, canonical in results.items()
        if "weight" in canonical
    }
    with torch.no_grad():
        expected = torch.cat(
            [sequence_logits(model, torch.tensor(w), tuned_linears) for w in windows]
        )
    served = paged_logits(load_float32_on_cpu(tuned_out), prompts=windows)
    # Two forwards' float sums differ in the last bits, and where an input lies on the edge
    # between two e4m3 codes that flips it: one token of the 120 here, its logits up to 0.09
    # apart. A wrongly written scale or norm would move every token.
    tokens_apart = ((served - expected).abs() > 1e-3).any(-1).sum().item()
    assert tokens_apart <= 3, tokens_apart

    tuned = load_file(str(tuned_out / "model.safetensors"))
    plain = load_file(str(plain_out / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj"
    assert tuned[f"{name}.weight"].dtype == torch.float8_e4m3fn
    codes = [folder[f"{name}.weight"].view(torch.uint8) for folder in (tuned, plain)]
    assert torch.equal(*codes)
    assert not torch.equal(tuned[f"{name}.weight_scale"], plain[f"{name}.weight_scale"])
    norm = "model.layers.0.post_attention_layernorm.weight"
    assert not torch.equal(tuned[norm], plain[norm])
