"""GPTQ (calibrated rounding, quant/gptq.py) against round-to-nearest on small random inputs at
awkward sizes, and `ladle quantize --algorithm gptq` checkpoints loaded back through ladle."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_models import load_float32_on_cpu
from safetensors.torch import load_file

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
    clipped = dequantize_int4_groups(*gptq_int4(weight, hessian, symmetric, clip="shrink"))
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
    from helpers.tiny_models import install_calibrated_, paged_logits, save_tiny_model

    from ladle.model.layers.quant import default_float_layers, get_quant_method
    from ladle.model.loader.calibration import (
        calibrate_checkpoint,
        calibrate_linears,
        gptq_quantizer,
    )
    from ladle.model.loader.quantized_writer import write_quantized_checkpoint

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

    reference = load_float32_on_cpu(float_model)
    float_logits = paged_logits(reference)
    results = calibrate_linears(
        reference.model, windows, gptq_quantizer(method), float_layers=float_layers
    )
    install_calibrated_(reference.model, method, results)
    in_memory = paged_logits(reference)
    assert torch.equal(paged_logits(load_float32_on_cpu(str(out))), in_memory)
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


def _textbook_gptq(weight, hessian, grid, order=None, damping=0.01):
    """GPTQ as the paper's first listing: one column at a time, its error pushed at once onto
    EVERY later column (no blocks), in float64. The reference for the lazy-block loop."""
    from ladle.model.layers.quant.gptq import inverse_hessian_factor

    work = weight.double().clone()
    hessian = hessian.double().clone()
    order = torch.arange(weight.shape[1]) if order is None else order
    work, hessian = work[:, order], hessian[order][:, order]
    upper = inverse_hessian_factor(hessian.float(), damping).double()
    rounded = torch.empty_like(work)
    for position in range(work.shape[1]):
        if position % 128 == 0:
            grid.begin_block(position, work[:, position : position + 128].float(), None)
        column = work[:, position]
        value = grid.round(int(order[position]), column.float()).double()
        rounded[:, position] = value
        error = (column - value) / upper[position, position]
        work[:, position + 1 :] -= error[:, None] * upper[position, position + 1 :][None, :]
    result = torch.empty_like(rounded)
    result[:, order] = rounded
    return result


@pytest.mark.parametrize("num_rows,num_inputs", [(7, 300), (16, 384), (1, 130)])
@pytest.mark.parametrize("act_order", [False, True])
def test_lazy_block_loop_equals_the_textbook_column_loop(num_rows, num_inputs, act_order):
    """The blocked loop (updates inside a block per column, one matmul for the columns after
    it) rounds every weight to the same code as the column-at-a-time loop, in natural order
    and in act-order with static groups."""
    from ladle.model.layers.quant.gptq import (
        Int4Grid,
        StaticInt4Grid,
        compensate_rounding,
    )

    _, hessian = _calibration(num_inputs, num_rows + 11)
    weight = torch.randn(num_rows, num_inputs, generator=torch.Generator().manual_seed(9))
    importance = hessian.diagonal()
    order = torch.argsort(importance, descending=True) if act_order else None

    def grid():
        if act_order:
            return StaticInt4Grid(weight, importance, False, None)
        return Int4Grid(weight, False, None)

    fast_grid, slow_grid = grid(), grid()
    fast = compensate_rounding(weight, hessian, fast_grid, order=order)
    slow = _textbook_gptq(weight, hessian, slow_grid, order)
    assert torch.equal(fast_grid.codes, slow_grid.codes)
    assert torch.equal(fast_grid.scale, slow_grid.scale)
    torch.testing.assert_close(fast, slow.float(), rtol=0, atol=1e-6)
    assert order is None or not torch.equal(order, torch.arange(num_inputs))  # really permuted


def _uneven_channels(seed: int, num_inputs: int = 300):
    """(inputs, their Hessian, a weight [16, K]) where the input channels' scales span two
    decades in random order: where act-order matters."""
    generator = torch.Generator().manual_seed(seed)
    inputs, _ = _calibration(num_inputs, 4)
    scales = torch.logspace(-1, 1, num_inputs)[torch.randperm(num_inputs, generator=generator)]
    inputs = inputs * scales
    accumulator = HessianAccumulator(num_inputs)
    accumulator.add(inputs)
    return inputs, accumulator.hessian(), torch.randn(16, num_inputs, generator=generator)


@pytest.mark.parametrize("symmetric", [False, True])
def test_act_order_with_static_groups_keeps_the_layout_and_beats_nearest_rounding(symmetric):
    """Static groups: every group's scale and zero are those of round-to-nearest on the
    uncompensated weight (clip None) whatever the visiting order, so codes stay in the
    g_idx = k // 128 layout; the compensated result beats round-to-nearest on inputs whose
    scales differ per channel (where act-order matters)."""
    inputs, hessian, weight = _uneven_channels(seed=12)
    rtn_codes, rtn_scale, rtn_zero = quantize_int4_groups(weight, symmetric=symmetric)
    codes, scale, zero = gptq_int4(weight, hessian, symmetric, act_order=True)
    assert torch.equal(scale, rtn_scale) and torch.equal(zero, rtn_zero)
    assert not torch.equal(codes, rtn_codes)
    act = dequantize_int4_groups(codes, scale, zero)
    rtn = dequantize_int4_groups(rtn_codes, rtn_scale, rtn_zero)
    assert _output_error(inputs, weight, act) < 0.9 * _output_error(inputs, weight, rtn)


@pytest.mark.parametrize("act_order", [False, True])
def test_weighted_clip_inside_gptq_beats_nearest_rounding(act_order):
    """GPTQ with each group's range from the weighted clipping search (int4_clip.py) has a
    lower output error than round-to-nearest on correlated inputs."""
    inputs, hessian = _calibration(384, 5)
    weight = torch.randn(16, 384, generator=torch.Generator().manual_seed(13))
    weight[:, ::17] *= 6  # outliers: clipping them is what the search weighs
    rtn = dequantize_int4_groups(*quantize_int4_groups(weight))
    clipped = dequantize_int4_groups(
        *gptq_int4(weight, hessian, clip="weighted", act_order=act_order)
    )
    assert _output_error(inputs, weight, clipped) < 0.9 * _output_error(inputs, weight, rtn)


def test_unknown_clip_mode_is_named():
    with pytest.raises(ValueError, match="clip mode 'mse'"):
        gptq_int4(torch.randn(4, 128), torch.eye(128), clip="mse")


@pytest.mark.parametrize("symmetric", [False, True])
def test_act_order_groups_follow_the_hessian_and_beat_nearest_rounding(symmetric):
    """Groups formed in act-order (desc_act): the 128 inputs of largest Hessian diagonal make
    group 0, and so on; g_idx names each input's group and the result beats round-to-nearest
    on inputs whose scales differ per channel."""
    from ladle.model.layers.quant.gptq import dequantize_int4_scattered, gptq_int4_act_order

    inputs, hessian, weight = _uneven_channels(seed=13)
    num_inputs = weight.shape[1]
    codes, scale, zero, g_idx = gptq_int4_act_order(weight, hessian, symmetric)
    assert torch.bincount(g_idx.long()).tolist() == [128, 128, 44]
    order = torch.argsort(hessian.diagonal(), descending=True, stable=True)
    assert torch.equal(g_idx[order].long(), torch.arange(num_inputs) // 128)
    act = dequantize_int4_scattered(codes, scale, zero, g_idx)
    rtn = dequantize_int4_groups(*quantize_int4_groups(weight, symmetric=symmetric))
    assert _output_error(inputs, weight, act) < 0.9 * _output_error(inputs, weight, rtn)


def test_act_order_checkpoint_loads_to_the_calibrated_weights(tmp_path):
    """`ladle quantize --act-order` (groups in act-order, desc_act true): the folder it writes
    loads (quant/act_order.py) to the logits of the float model holding the calibrated
    weights."""
    from helpers.tiny_models import paged_logits, save_tiny_model

    from ladle.model.layers.quant import get_quant_method
    from ladle.model.loader.calibration import (
        calibrate_checkpoint,
        calibrate_linears,
        gptq_quantizer,
    )
    from ladle.model.loader.quantized_writer import write_quantized_checkpoint

    # hidden 320 and intermediate 200: every input of several groups (o's 64: one group).
    float_model = save_tiny_model(tmp_path, "qwen2", hidden_size=320, intermediate_size=200)
    windows = [list(range(3, 60)), list(range(40, 100)), list(range(7, 30))]
    method = get_quant_method("int4")
    calibrated = calibrate_checkpoint(
        float_model, method, torch.float32, windows, act_order="dynamic"
    )
    out = tmp_path / "act_order"
    write_quantized_checkpoint(float_model, out, "int4", "gptq", torch.float32, False, calibrated)
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["desc_act"] is True
    g_idx = load_file(str(out / "model.safetensors"))["model.layers.0.mlp.down_proj.g_idx"]
    assert not torch.equal(g_idx.long(), torch.arange(200) // 128)  # really scattered
    loaded = load_float32_on_cpu(str(out))
    assert any(getattr(m, "input_permutation", None) is not None for m in loaded.model.modules())
    reference = load_float32_on_cpu(float_model)
    calibrate_linears(reference.model, windows, gptq_quantizer(method, None, "dynamic"))
    torch.testing.assert_close(paged_logits(loaded), paged_logits(reference), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="written as gptq, not awq"):
        write_quantized_checkpoint(
            float_model, tmp_path / "awq", "int4", "awq", torch.float32, False, calibrated
        )
