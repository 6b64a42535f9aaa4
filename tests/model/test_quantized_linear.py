"""Weight-only int8 (quantized_linear.py) against plain torch, and the quantized model against
the float32 one."""

from __future__ import annotations

import pytest
import torch

from ladle.model.layers import quantized_linear
from ladle.model.layers.cpu_int8_gemm import engine_has_vnni
from ladle.model.layers.embedding import VocabEmbedding
from ladle.model.layers.linear import Linear, QKVLinear
from ladle.model.layers.quantize_pass import quantize_model_
from ladle.model.layers.quantized_linear import (
    dequantize_int8_per_row,
    int8_weight_matmul,
    quantize_int8_per_row,
)


@pytest.mark.parametrize("shape", [(1, 7), (7, 33), (300, 576), (1000, 129)])
def test_quantize_error_is_within_half_a_step(shape):
    weight = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    weight[0] = 0.0  # an all-zero row must not divide by zero
    codes, scale = quantize_int8_per_row(weight)
    assert codes.dtype == torch.int8 and scale.shape == (shape[0],)
    error = (dequantize_int8_per_row(codes, scale) - weight).abs()
    assert torch.all(error <= scale[:, None] / 2 + 1e-6)
    assert torch.all(dequantize_int8_per_row(codes[:1], scale[:1]) == 0)


@pytest.mark.parametrize("num_tokens", [1, 7, 64])
@pytest.mark.parametrize("num_rows", [1, 7, 1500])
def test_chunked_matmul_matches_dequantized_reference(monkeypatch, num_tokens, num_rows):
    # Small chunks, so that 1500 rows of 96 take several chunks and a ragged last one; the GEMV
    # for few rows is tested below.
    monkeypatch.setattr(quantized_linear, "CHUNK_ELEMENTS", 96 * 64)
    monkeypatch.setattr(quantized_linear, "GEMV_MAX_ROWS", 0)
    generator = torch.Generator().manual_seed(1)
    codes, scale = quantize_int8_per_row(torch.randn(num_rows, 96, generator=generator))
    x = torch.randn(num_tokens, 96, generator=generator)
    bias = torch.randn(num_rows, generator=generator)
    expected = x @ dequantize_int8_per_row(codes, scale).T + bias
    # Same math, different summation order (scale applied after the dot product).
    actual = int8_weight_matmul(x, codes, scale, bias)
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("num_tokens", [1, 3, 4])
@pytest.mark.parametrize(("num_rows", "num_columns"), [(7, 96), (960, 576), (17, 100)])
def test_few_rows_match_the_reference_with_bfloat16_activations(num_tokens, num_rows, num_columns):
    """Up to GEMV_MAX_ROWS rows run the int8-weight GEMV on bfloat16 activations: its result is
    the dequantized weight times the bfloat16-rounded input, to bfloat16 output rounding. A K
    that the GEMV cannot take (100: not a multiple of 16, where torch's kernel crashes) runs
    the float32 path, exactly."""
    generator = torch.Generator().manual_seed(2)
    codes, scale = quantize_int8_per_row(torch.randn(num_rows, num_columns, generator=generator))
    x = torch.randn(num_tokens, num_columns, generator=generator)
    bias = torch.randn(num_rows, generator=generator)
    weight = dequantize_int8_per_row(codes, scale)
    actual = int8_weight_matmul(x, codes, scale, bias)
    uses_gemv = num_columns % 16 == 0 and quantized_linear.int8_gemv_available()
    if uses_gemv:
        expected = x.bfloat16().float() @ weight.T + bias
        error = (actual - expected).abs().max() / expected.abs().max()
        assert error < 2**-7  # bfloat16 output rounding, one part in 256
        assert (actual - (x @ weight.T + bias)).abs().max() > 0  # the GEMV really ran
    else:
        torch.testing.assert_close(actual, x @ weight.T + bias, atol=1e-4, rtol=1e-5)


def test_quantize_model_replaces_weights_and_keeps_outputs_close():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {"qkv": QKVLinear(64, 16, 4, 2, bias=True), "embed": VocabEmbedding(100, 64)}
    )
    for param in model.parameters():
        param.data.normal_()
    x = torch.randn(5, 64)
    ids = torch.tensor([0, 99, 5])
    expected_qkv = model["qkv"](x)
    expected_logits = model["embed"].logits(x)
    expected_rows = model["embed"](ids)
    assert sorted(quantize_model_(model, "int8")) == ["embed", "qkv"]
    # The matmul runs on the int8 engine's packed copy where torch has one, else on the codes.
    assert model["qkv"].weight is None and model["embed"].weight_codes.dtype == torch.int8
    # A 64-long dot product of unit normals spreads ~8; int8 keeps it within 3% of that with the
    # engine's VNNI kernels (greatest differences measured, qkv and logits: 0.237, 0.208), ~5%
    # with its AVX2 ones, whose activations keep 7 bits (0.373, 0.326; engine_has_vnni).
    atol = 0.25 if engine_has_vnni() else 0.45
    torch.testing.assert_close(model["qkv"](x), expected_qkv, atol=atol, rtol=0)
    torch.testing.assert_close(model["embed"].logits(x), expected_logits, atol=atol, rtol=0)
    torch.testing.assert_close(model["embed"](ids), expected_rows, atol=0.02, rtol=0.01)
    q, k, v = model["qkv"].split(model["qkv"](x))
    assert q.shape == (5, 64) and k.shape == v.shape == (5, 32)


def test_unknown_method_is_rejected():
    layer = Linear(8, 8)
    with pytest.raises(ValueError, match="int3"):
        quantize_model_(layer, "int3")


def test_auto_quantization_keeps_gguf_quantized_on_the_cpu_unless_a_dtype_is_given():
    from ladle.config import ModelConfig
    from ladle.kernels.cpu_native.build import native_library, set_native_kernels
    from ladle.model.loader import resolve_quantization

    cpu = torch.device("cpu")
    # its own blocks where the C kernels are built, else weight-only int8
    kept = "gguf" if native_library() is not None else "int8"
    assert resolve_quantization(ModelConfig(), "gguf", cpu) == kept
    previous = set_native_kernels(False)
    try:
        assert resolve_quantization(ModelConfig(), "gguf", cpu) == "int8"
    finally:
        set_native_kernels(previous)
    assert resolve_quantization(ModelConfig(dtype="float32"), "gguf", cpu) is None
    assert resolve_quantization(ModelConfig(), "safetensors", cpu) is None
    assert resolve_quantization(ModelConfig(quantization="none"), "gguf", cpu) is None
    assert resolve_quantization(ModelConfig(quantization="int8"), "dummy", cpu) == "int8"
    with pytest.raises(ValueError, match="CPU only"):
        resolve_quantization(ModelConfig(quantization="int8"), "gguf", torch.device("meta"))
    with pytest.raises(ValueError, match="quantization 'fp4'"):
        ModelConfig(quantization="fp4")


def test_gguf_and_int4_methods_resolve_on_the_cpu_and_gguf_needs_a_gguf_file():
    from ladle.config import ModelConfig
    from ladle.model.loader import resolve_quantization

    cpu = torch.device("cpu")
    assert resolve_quantization(ModelConfig(quantization="gguf"), "gguf", cpu) == "gguf"
    assert resolve_quantization(ModelConfig(quantization="int4"), "safetensors", cpu) == "int4"
    with pytest.raises(ValueError, match="'gguf' keeps a GGUF file's tensors"):
        resolve_quantization(ModelConfig(quantization="gguf"), "safetensors", cpu)
    with pytest.raises(ValueError, match="quantization 'int5' is not one of"):
        ModelConfig(quantization="int5")
