"""The CPU side of handing quantized activations to fp8 projections (quant/input_fusion.py): an
fp8 projection given a QuantizedActivation computes what it computes from the bf16 tensor, the
load-time linking picks exactly the producers whose consumer takes fp8 input (and none when
switched off), and a linked producer that cannot fuse (the CPU) still returns its tensor. The
fused Triton kernels themselves are tested in tests/gpu/test_fused_activation_quant_gpu.py."""

from __future__ import annotations

import pytest
import torch

from ladle.model.layers.quant import quantize_linears_
from ladle.model.layers.quant.fp8 import FP8_DTYPE, quantize_activation_fp8
from ladle.model.layers.quant.input_fusion import (
    FUSED_ACTIVATION_QUANT_ENV,
    link_quantized_inputs_,
)
from ladle.model.layers.quantized_activation import QuantizedActivation


def _fp8_layer(input_size: int, output_sizes: list[int]):
    from ladle.model.layers.linear import MergedLinear

    torch.manual_seed(0)
    layer = MergedLinear(input_size, output_sizes, bias=True)
    layer.weight.data.normal_()
    layer.bias.data.normal_()
    quantize_linears_(torch.nn.Sequential(layer), "fp8")
    return layer


@pytest.mark.parametrize("tokens,input_size", [(1, 200), (7, 48), (5, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_projection_takes_a_quantized_activation_in_place_of_its_tensor(
    tokens, input_size, dtype
):
    layer = _fp8_layer(input_size, [7, 9])
    x = (torch.randn(tokens, input_size) * 3).to(dtype)
    codes, scale = quantize_activation_fp8(x)
    output = layer(QuantizedActivation(codes, scale, dtype))
    expected = layer(x)
    assert output.dtype == expected.dtype == dtype and output.shape == (tokens, 16)
    assert torch.equal(output, expected)
    # Codes that are not the input's (a wrong scale) must change the result: the codes are used.
    changed = layer(QuantizedActivation(codes, scale * 2, dtype))
    assert not torch.equal(changed, expected)


def test_quantized_activation_rejects_mismatched_tensors():
    codes = torch.zeros(3, 8, dtype=FP8_DTYPE)
    with pytest.raises(ValueError, match=r"scales \[M, 1\]"):
        QuantizedActivation(codes, torch.ones(3), torch.bfloat16)
    with pytest.raises(ValueError, match=r"scales \[M, 1\]"):
        QuantizedActivation(codes, torch.ones(4, 1), torch.bfloat16)
    with pytest.raises(ValueError, match="float32"):
        QuantizedActivation(codes, torch.ones(3, 1, dtype=torch.float16), torch.bfloat16)
    layer = _fp8_layer(8, [16])
    int8_input = QuantizedActivation(
        torch.zeros(3, 8, dtype=torch.int8), torch.ones(3, 1), torch.float32
    )
    with pytest.raises(ValueError, match="torch.int8 activation codes"):
        layer(int8_input)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    from helpers.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("fused_quant"), "llama", num_hidden_layers=3)


def _load_fp8(path: str):
    from ladle.attention.torch_backend import TorchAttentionBackend
    from ladle.config import ModelConfig
    from ladle.model.loader import load_model

    loaded = load_model(
        ModelConfig(model=path), torch.device("cpu"), torch.float32, TorchAttentionBackend()
    )
    quantize_linears_(loaded.model, "fp8")  # the CPU: no _scaled_mm, nothing linked
    return loaded


PRODUCERS = ("input_layernorm", "post_attention_layernorm", "mlp.act_fn")


def _producers(model) -> dict[str, torch.dtype | None]:
    """Each decoder layer's producers' output_quantization, by "layer.name"."""
    return {
        f"{index}.{name}": model.get_submodule(f"model.layers.{index}.{name}").output_quantization
        for index in range(len(model.model.layers))
        for name in PRODUCERS
    }


def test_linking_follows_each_consumer_and_the_switch(tiny_llama, monkeypatch):
    from helpers.tiny_models import paged_logits

    loaded = _load_fp8(tiny_llama)
    model = loaded.model
    assert set(_producers(model).values()) == {None}
    before = paged_logits(loaded)
    # As on a GPU with _scaled_mm: every fp8 projection takes e4m3 input. The last decoder
    # layer stays in the model dtype (KEEP_LAST_LAYERS), so its producers stay plain.
    fp8_linears = [m for m in model.modules() if getattr(m, "quant_method", None) is not None]
    for linear in fp8_linears:
        linear.use_scaled_mm = True
    monkeypatch.delenv(FUSED_ACTIVATION_QUANT_ENV, raising=False)
    assert link_quantized_inputs_(model) == 6
    expected = {f"{i}.{n}": FP8_DTYPE if i < 2 else None for i in range(3) for n in PRODUCERS}
    assert _producers(model) == expected
    # One consumer on the dequantizing path (an unaligned size): its producer stays plain.
    model.model.layers[0].mlp.down_proj.use_scaled_mm = False
    assert link_quantized_inputs_(model) == 5
    assert model.model.layers[0].mlp.act_fn.output_quantization is None
    assert link_quantized_inputs_(model, enabled=False) == 0
    assert set(_producers(model).values()) == {None}
    monkeypatch.setenv(FUSED_ACTIVATION_QUANT_ENV, "0")
    assert link_quantized_inputs_(model) == 0
    # Linked producers on the CPU cannot fuse: they hand over plain tensors, same logits.
    monkeypatch.setenv(FUSED_ACTIVATION_QUANT_ENV, "1")
    assert link_quantized_inputs_(model) == 5
    for linear in fp8_linears:
        linear.use_scaled_mm = False
    assert torch.equal(paged_logits(loaded), before)


def _handing_over_quantized(forward):
    """A producer's forward that, when linked, hands its output over quantized (what the CUDA
    kernels do), here through the torch path so the model's plumbing runs on the CPU."""

    def quantize(output: torch.Tensor) -> QuantizedActivation:
        return QuantizedActivation(*quantize_activation_fp8(output), output.dtype)

    def wrapped(self, *args, **kwargs):
        output = forward(self, *args, **kwargs)
        if self.output_quantization is None:
            return output
        if isinstance(output, tuple):
            handed = (quantize(output[0]), output[1])
        else:
            handed = quantize(output)
        wrapped.num_handed += 1
        return handed

    wrapped.num_handed = 0
    return wrapped


def test_a_model_whose_producers_hand_over_quantized_activations_gives_the_same_logits(
    tiny_llama, monkeypatch
):
    from helpers.tiny_models import paged_logits

    from ladle.model.layers.activation import SiluAndMul
    from ladle.model.layers.norm import RMSNorm

    loaded = _load_fp8(tiny_llama)
    before = paged_logits(loaded)
    fp8_linears = [m for m in loaded.model.modules() if getattr(m, "quant_method", None)]
    for linear in fp8_linears:
        linear.use_scaled_mm = True
    assert link_quantized_inputs_(loaded.model, enabled=True) == 6
    for linear in fp8_linears:  # back on the CPU's path, which takes either input
        linear.use_scaled_mm = False
    norm_forward = _handing_over_quantized(RMSNorm.forward)
    activation_forward = _handing_over_quantized(SiluAndMul.forward)
    monkeypatch.setattr(RMSNorm, "forward", norm_forward)
    monkeypatch.setattr(SiluAndMul, "forward", activation_forward)
    after = paged_logits(loaded)
    assert (norm_forward.num_handed, activation_forward.num_handed) == (4, 2)
    assert torch.equal(after, before)


def test_a_producer_without_the_switch_is_named():
    class Pairs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.producer = torch.nn.ReLU()
            self.consumer = _fp8_layer(16, [16])

        def quantized_input_pairs(self):
            return [(self.producer, self.consumer)]

    with pytest.raises(TypeError, match="ReLU"):
        link_quantized_inputs_(Pairs())
