"""GPU weight quantization: fp8 (W8A8 e4m3), int8 (W8A8), int4 (weight-only, group 128).

    quantize_linears_(model, "fp8")                 quantize a loaded float model in place
    prepare_linears_for_checkpoint_(model, method)  empty canonical tensors for a checkpoint
    finalize_linears_(model)                        canonical -> runtime layout, after loading

Both then link the norms and activations that feed fp8 projections to quantize their own output
(input_fusion.py; LADLE_FUSED_ACTIVATION_QUANT=0 turns that off).

Every Linear of the decoder layers is quantized; the embedding and the LM head stay in the model
dtype (as vLLM does for these methods): they are a small share of an 8B model's bytes and the
logits are the most sensitive product. fp8 also keeps the LAST decoder layer's projections in the
model dtype (KEEP_LAST_LAYERS): measured on the default model, that one layer in fp8 costs +1.0%
perplexity of the +2.3% that fp8 costs in all 30 (docs/quantization.md, "Quality"); it is 1/30
of the projection weights there and 1/32 of an 8B model's. Checkpoints name such layers in
`modules_to_not_convert`. The CPU's weight-only int8 lives in quantized_linear.py.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import torch
from torch import nn

from ladle.model.layers.linear import Linear
from ladle.model.layers.quant.base import QuantMethod, canonical_tensors, install_canonical_
from ladle.model.layers.quant.fp8 import Fp8Method
from ladle.model.layers.quant.input_fusion import link_quantized_inputs_
from ladle.model.layers.quant.int4 import Int4Method
from ladle.model.layers.quant.int8 import Int8Method

QUANT_METHODS = ("fp8", "int8", "int4")
# How many of the last decoder layers each method leaves in the model dtype by default.
KEEP_LAST_LAYERS = {"fp8": 1, "int8": 0, "int4": 0}
LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")

__all__ = [
    "QUANT_METHODS",
    "QuantMethod",
    "KEEP_LAST_LAYERS",
    "canonical_tensors",
    "default_float_layers",
    "in_layers",
    "finalize_linears_",
    "get_quant_method",
    "link_quantized_inputs_",
    "prepare_linears_for_checkpoint_",
    "quantize_linears_",
]


def get_quant_method(name: str, symmetric: bool = False) -> QuantMethod:
    """The method called `name` (fp8, int8, int4); `symmetric` applies to int4 only."""
    if name == "fp8":
        return Fp8Method()
    if name == "int8":
        return Int8Method()
    if name == "int4":
        return Int4Method(symmetric=symmetric)
    raise ValueError(f"quantization method {name!r} is not one of {', '.join(QUANT_METHODS)}")


def default_float_layers(method_name: str, num_layers: int | None) -> set[int]:
    """Indices of the decoder layers `method_name` leaves in the model dtype by default."""
    keep = KEEP_LAST_LAYERS.get(method_name, 0)
    return set(range(max(num_layers - keep, 0), num_layers)) if num_layers and keep else set()


def in_layers(name: str, layer_indices: Collection[int]) -> bool:
    """Whether a module or tensor name lies in one of the decoder layers `layer_indices`."""
    match = LAYER_INDEX.search(name)
    return match is not None and int(match[1]) in layer_indices


def _linears(model: nn.Module) -> list[tuple[str, Linear]]:
    return [(name, module) for name, module in model.named_modules() if isinstance(module, Linear)]


@torch.no_grad()
def quantize_linears_(
    model: nn.Module, method: QuantMethod | str, float_layers: Collection[int] | None = None
) -> list[str]:
    """Quantize every Linear's weight in place (one layer at a time, so the peak is one float
    weight's float32 copy) and build the runtime layout, except in the decoder layers
    `float_layers` (default: the method's default_float_layers). Returns the quantized modules'
    names."""
    method = get_quant_method(method) if isinstance(method, str) else method
    if float_layers is None:
        config = getattr(model, "config", None)
        float_layers = default_float_layers(method.name, getattr(config, "num_hidden_layers", None))
    names = []
    for name, linear in _linears(model):
        if in_layers(name, float_layers):
            continue
        tensors = method.quantize(linear.weight.data)
        install_canonical_(linear, method, tensors)
        method.finalize(linear)
        names.append(name)
    link_quantized_inputs_(model)
    if torch.cuda.is_available():
        # The float weights' blocks go back to the driver, so the KV cache can be sized over them.
        torch.cuda.empty_cache()
    return names


def prepare_linears_for_checkpoint_(
    model: nn.Module, method: QuantMethod, float_modules: Collection[str] = ()
) -> None:
    """Swap every Linear's float weight for empty canonical tensors that a quantized checkpoint's
    weights (converted by its format) load into by name; modules in `float_modules` (the
    checkpoint's modules_to_not_convert) keep their float weight."""
    for name, linear in _linears(model):
        if name not in float_modules:
            install_canonical_(linear, method)


@torch.no_grad()
def finalize_linears_(model: nn.Module) -> None:
    """Build each quantized Linear's runtime layout once its canonical tensors are loaded."""
    for _, linear in _linears(model):
        if linear.quant_method is not None:
            linear.quant_method.finalize(linear)
    link_quantized_inputs_(model)
