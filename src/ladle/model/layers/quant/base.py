"""The interface every GPU quantization method implements, and the helpers that swap a Linear's
float weight for a method's tensors.

A method has two layouts:
  canonical  the tensors a checkpoint stores, every one with the output rows on dim 0, so the
             Linear's row-slice weight loader fills merged q/k/v and gate/up shards unchanged.
             `ladle quantize` writes them (through a format) and loading reads them back.
  runtime    what the matmul wants (a transposed view, a repacked int4 matrix): made once by
             finalize() after the canonical tensors are filled.
Quantizing in memory and loading a quantized checkpoint both pass through the canonical tensors,
which is why the two give the same logits.

A quantized merged layer's gate_up_silu (MergedLinear, linear.py) asks its method
(QuantMethod.gate_up_silu) for the MLP's fused gate-up and SiLU-and-mul at one row: the float
layer's own fused launch reads a float weight.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

TensorSpec = tuple[tuple[int, ...], torch.dtype]


class QuantMethod(ABC):
    """One weight format: how to quantize a weight, how to load it, how to multiply by it."""

    name: str

    @abstractmethod
    def canonical_specs(self, output_size: int, input_size: int) -> dict[str, TensorSpec]:
        """Name -> (shape, dtype) of each canonical tensor of an [N, K] weight."""

    @abstractmethod
    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """The canonical tensors of a float weight [N, K] (computed in float32)."""

    @abstractmethod
    def dequantize(self, tensors: dict[str, torch.Tensor], input_size: int) -> torch.Tensor:
        """The float32 weight [N, K] that canonical tensors stand for (the matmul's reference)."""

    def finalize(self, layer: nn.Module) -> None:  # noqa: B027 - optional hook, default none
        """Build the runtime layout from the filled canonical parameters (default: none)."""

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x [..., K] -> x W^T (+ bias) [..., N] in x's dtype."""

    def input_quantization(self, layer: nn.Module) -> torch.dtype | None:
        """The code dtype in which `layer` (finalized) takes its input already quantized per
        token (a QuantizedActivation, quant/input_fusion.py), or None: plain tensors only."""
        return None

    def gate_up_silu(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up [tokens, d] of a merged [gate; up] `layer` (finalized; equal halves,
        no bias) in one launch, or None (the default): the MLP then runs apply() and
        SiLU-and-mul. x may be a QuantizedActivation where input_quantization says so."""
        return None


class PerRowScaledMethod(QuantMethod):
    """A method whose checkpoint is one code per weight plus one float32 scale per output row
    (fp8, int8): the canonical layout and its dequantization are shared; subclasses give the
    code dtype and the quantizer."""

    code_dtype: torch.dtype

    @abstractmethod
    def quantize_rows(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes [N, K] of code_dtype, scale [N] float32) of a float weight."""

    def canonical_specs(self, output_size: int, input_size: int) -> dict[str, TensorSpec]:
        return {
            "weight": ((output_size, input_size), self.code_dtype),
            "weight_scale": ((output_size,), torch.float32),
        }

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, scale = self.quantize_rows(weight)
        return {"weight": codes, "weight_scale": scale}

    def dequantize(self, tensors: dict[str, torch.Tensor], input_size: int) -> torch.Tensor:
        return tensors["weight"].float() * tensors["weight_scale"][:, None]


def install_canonical_(
    layer: nn.Module, method: QuantMethod, tensors: dict[str, torch.Tensor] | None = None
) -> None:
    """Replace layer.weight by the method's canonical tensors as parameters: `tensors` when given
    (quantized in memory), else empty ones of the right shape for a checkpoint to fill."""
    device = layer.weight.device
    del layer.weight
    layer.weight = None
    for name, (shape, dtype) in method.canonical_specs(layer.output_size, layer.input_size).items():
        value = tensors[name] if tensors is not None else torch.empty(shape, dtype=dtype)
        if tuple(value.shape) != shape or value.dtype != dtype:
            raise ValueError(
                f"{method.name} tensor {name!r} is {tuple(value.shape)} {value.dtype}; "
                f"expected {shape} {dtype}"
            )
        setattr(layer, name, nn.Parameter(value.to(device), requires_grad=False))
    layer.quant_method = method


def canonical_tensors(layer: nn.Module) -> dict[str, torch.Tensor]:
    """The layer's canonical tensors by name (after install_canonical_)."""
    method: QuantMethod = layer.quant_method
    specs = method.canonical_specs(layer.output_size, layer.input_size)
    return {name: getattr(layer, name).data for name in specs}


def flatten_tokens(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """x [..., K] as a contiguous [tokens, K] matrix, and the leading shape to restore."""
    return x.reshape(-1, x.shape[-1]).contiguous(), tuple(x.shape[:-1])


def add_bias(output: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return output if bias is None else output + bias
