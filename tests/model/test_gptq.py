"""GPTQ (calibrated rounding, quant/gptq.py) against round-to-nearest on small random inputs at
awkward sizes, and `ladle quantize --algorithm gptq` checkpoints loaded back through ladle."""

from __future__ import annotations

import pytest
import torch

from ladle.model.layers.quant.fp8 import quantize_fp8_per_row
from ladle.model.layers.quant.gptq import HessianAccumulator, gptq_fp8, gptq_int4
from ladle.model.layers.quant.int4 import dequantize_int4_groups, quantize_int4_groups

# (rows N, inputs K): N = 1 and 7; K below one group, one and a partial group, several groups.
SHAPES = [(1, 300), (7, 200), (7, 100), (16, 384)]


def _calibration(num_inputs: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Correlated inputs [512, K] (GPTQ only helps where inputs are correlated) and their
    Hessian."""
    generator = torch.Generator().manual_seed(seed)
    mixing = torch.eye(num_inputs) + 0.3 * torch.randn(num_inputs, num_inputs, generator=generator)
    inputs = torch.randn(512, num_inputs, generator=generator) @ mixing
    accumulator = HessianAccumulator(num_inputs)
    accumulator.add(inputs[:200])
    accumulator.add(inputs[200:])  # accumulation over calls is the mean over all rows
    return inputs, accumulator.hessian()


def _output_error(inputs: torch.Tensor, weight: torch.Tensor, approx: torch.Tensor) -> float:
    return ((inputs @ (approx - weight).t()).norm() / (inputs @ weight.t()).norm()).item()


def test_hessian_is_the_mean_outer_product():
    inputs, hessian = _calibration(9, 0)
    torch.testing.assert_close(hessian, inputs.t() @ inputs / inputs.shape[0])


@pytest.mark.parametrize("num_rows,num_inputs", SHAPES)
@pytest.mark.parametrize("symmetric", [False, True])
def test_gptq_int4_output_error_is_below_round_to_nearest(num_rows, num_inputs, symmetric):
    inputs, hessian = _calibration(num_inputs, num_rows)
    weight = torch.randn(num_rows, num_inputs, generator=torch.Generator().manual_seed(5))
    rtn = dequantize_int4_groups(*quantize_int4_groups(weight, symmetric=symmetric))
    codes, scale, zero = gptq_int4(weight, hessian, symmetric)
    assert codes.dtype == torch.uint8 and int(codes.max()) <= 15
    assert scale.dtype == torch.float16 and scale.shape == (num_rows, -(-num_inputs // 128))
    if symmetric:
        assert torch.all(zero == 8)
    gptq = dequantize_int4_groups(codes, scale, zero)
    assert _output_error(inputs, weight, gptq) < 0.9 * _output_error(inputs, weight, rtn)
    clipped = dequantize_int4_groups(*gptq_int4(weight, hessian, symmetric, search_clip=True))
    assert _output_error(inputs, weight, clipped) < _output_error(inputs, weight, rtn)


@pytest.mark.parametrize("num_rows,num_inputs", SHAPES)
def test_gptq_int4_is_exact_on_weights_already_on_the_grid(num_rows, num_inputs):
    """A weight that round-to-nearest reproduces exactly has no error to push anywhere."""
    generator = torch.Generator().manual_seed(3)
    num_groups = -(-num_inputs // 128)
    codes = torch.randint(0, 16, (num_rows, num_inputs), generator=generator)
    for start in range(0, num_inputs, 128):  # every group uses levels 0 and 15
        codes[:, start], codes[:, min(start + 1, num_inputs - 1)] = 0, 15
    scale = (torch.rand(num_rows, num_groups, generator=generator) + 0.5).half()
    zero = torch.randint(1, 15, (num_rows, num_groups), generator=generator).to(torch.uint8)
    weight = dequantize_int4_groups(codes, scale, zero)
    _, hessian = _calibration(num_inputs, 1)
    got_codes, got_scale, got_zero = gptq_int4(weight, hessian)
    assert torch.equal(got_codes, codes.to(torch.uint8))
    assert torch.equal(got_scale, scale) and torch.equal(got_zero, zero)


def test_gptq_leaves_inputs_never_seen_in_calibration_rounded_plainly():
    """A Hessian with a dead input (zero column) still factors; that input's weights are only
    rounded, and the others still beat round-to-nearest."""
    inputs, _ = _calibration(130, 2)
    inputs[:, 7] = 0
    accumulator = HessianAccumulator(130)
    accumulator.add(inputs)
    weight = torch.randn(7, 130, generator=torch.Generator().manual_seed(4))
    gptq = dequantize_int4_groups(*gptq_int4(weight, accumulator.hessian()))
    rtn = dequantize_int4_groups(*quantize_int4_groups(weight))
    assert torch.isfinite(gptq).all()
    assert _output_error(inputs, weight, gptq) < _output_error(inputs, weight, rtn)


@pytest.mark.parametrize("num_rows,num_inputs", SHAPES)
def test_gptq_fp8_keeps_the_per_row_scales_and_beats_nearest_rounding(num_rows, num_inputs):
    inputs, hessian = _calibration(num_inputs, 7)
    weight = torch.randn(num_rows, num_inputs, generator=torch.Generator().manual_seed(6))
    nearest_codes, nearest_scale = quantize_fp8_per_row(weight)
    codes, scale = gptq_fp8(weight, hessian)
    assert torch.equal(scale, nearest_scale) and codes.dtype == nearest_codes.dtype
    nearest = nearest_codes.float() * nearest_scale[:, None]
    gptq = codes.float() * scale[:, None]
    assert _output_error(inputs, weight, gptq) < 0.9 * _output_error(inputs, weight, nearest)


@pytest.mark.parametrize(
    "method_name,fmt,symmetric",
    [("int4", "gptq", True), ("int4", "awq", False), ("fp8", "hf-fp8", False)],
)
def test_calibrated_checkpoint_loads_to_the_in_memory_calibrated_logits(
    tmp_path, method_name, fmt, symmetric
):
    """The calibration pass quantizes layer by layer; the folder it writes loads back (through
    the format's reader) to exactly the logits of the same pass applied in memory."""
    from helpers.tiny_models import paged_logits, save_tiny_model

    from ladle.attention.torch_backend import TorchAttentionBackend
    from ladle.config import ModelConfig
    from ladle.model.layers.quant import default_float_layers, get_quant_method
    from ladle.model.layers.quant.base import install_canonical_
    from ladle.model.loader import load_model
    from ladle.model.loader.calibration import (
        calibrate_checkpoint,
        calibrate_linears,
        gptq_quantizer,
    )
    from ladle.model.loader.quantized_writer import write_quantized_checkpoint

    def load(path: str):
        config = ModelConfig(model=path, dtype="float32")
        return load_model(config, torch.device("cpu"), torch.float32, TorchAttentionBackend())

    # intermediate 200: down_proj has K = 200, two int4 groups, the second partial.
    float_model = save_tiny_model(tmp_path, "qwen2", intermediate_size=200)
    windows = [list(range(3, 60)), list(range(40, 100)), list(range(7, 30))]
    method = get_quant_method(method_name, symmetric=symmetric)
    float_layers = default_float_layers(method_name, 2)
    calibrated = calibrate_checkpoint(
        float_model, method, torch.float32, windows, float_layers=float_layers
    )
    out = tmp_path / "calibrated"
    summary = write_quantized_checkpoint(
        float_model, out, method_name, fmt, torch.float32, symmetric, calibrated
    )
    num_float_layers = 1 if method_name == "fp8" else 0  # fp8 keeps its last layer float
    assert summary["calibrated"] == summary["quantized"] == (2 - num_float_layers) * 7

    reference = load(float_model)
    float_logits = paged_logits(reference)
    results = calibrate_linears(
        reference.model, windows, gptq_quantizer(method), float_layers=float_layers
    )
    for name, canonical in results.items():
        module = reference.model.get_submodule(name)
        install_canonical_(module, method, canonical)
        method.finalize(module)
    in_memory = paged_logits(reference)
    assert torch.equal(paged_logits(load(str(out))), in_memory)
    error = ((in_memory - float_logits).norm() / float_logits.norm()).item()
    assert 0 < error < 0.5


def test_calibrated_weights_the_checkpoint_lacks_are_an_error(tmp_path):
    from helpers.tiny_models import save_tiny_model

    from ladle.model.layers.quant import get_quant_method
    from ladle.model.loader.quantized_writer import write_quantized_checkpoint

    float_model = save_tiny_model(tmp_path, "llama")
    tensors = get_quant_method("fp8").quantize(torch.randn(4, 4))
    with pytest.raises(ValueError, match="model.layers.9.mlp.down_proj.weight"):
        write_quantized_checkpoint(
            float_model,
            tmp_path / "out",
            "fp8",
            calibrated={"model.layers.9.mlp.down_proj.weight": tensors},
        )
