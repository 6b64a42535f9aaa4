"""Which layers hand their output to a quantized projection already quantized per token.

An fp8 projection quantizes its bf16 input per token before its GEMM: one more launch and one
more bf16 round trip through memory per projection (124 launches, 0.39 ms of a 7.71 ms batch-64
decode step of the 8B shape, before). Where the input comes from a fused Triton kernel whose
output goes to that one projection only, the kernel quantizes the row in registers instead and
returns a QuantizedActivation (the same codes and scales, bit for bit).

A model names such (producer, consumer) pairs through a method `quantized_input_pairs()` on any
of its modules (the Llama decoder layer: input norm -> qkv, post-attention norm -> gate_up; not
SiLU-and-mul -> down, whose fused kernel measured slower than the pair). Once the projections
are quantized and finalized (at load), each producer's `output_quantization` is set to the code
dtype its consumer takes (QuantMethod.input_quantization: e4m3 for an fp8 projection on the
_scaled_mm / Triton GEMM), or None. It is an attribute fixed at load, so a decode step under
CUDA graphs does the same work on capture and replay; a producer that cannot fuse a call (the
CPU, LADLE_FUSED_KERNELS=0, an unusual shape) returns its plain tensor, which every consumer
still takes.

LADLE_FUSED_ACTIVATION_QUANT=0 in the environment at load (or enabled=False) leaves every
producer unlinked: each projection quantizes its own input as before (the benchmarks'
before/after, and the reference of the logits test).
"""

from __future__ import annotations

import os

import torch
from torch import nn

FUSED_ACTIVATION_QUANT_ENV = "LADLE_FUSED_ACTIVATION_QUANT"


def fused_activation_quant_enabled() -> bool:
    """Whether producers may quantize for their consumers (the environment's switch)."""
    return os.environ.get(FUSED_ACTIVATION_QUANT_ENV, "1") != "0"


def link_quantized_inputs_(model: nn.Module, enabled: bool | None = None) -> int:
    """Set every declared producer's `output_quantization` from its consumer's quantization
    method (None where the consumer takes plain tensors, or when disabled). `enabled` defaults
    to the environment's switch. Returns the number of producers that now quantize."""
    if enabled is None:
        enabled = fused_activation_quant_enabled()
    num_linked = 0
    for module in model.modules():
        pairs = getattr(module, "quantized_input_pairs", None)
        if pairs is None:
            continue
        for producer, consumer in pairs():
            if not hasattr(producer, "output_quantization"):
                raise TypeError(
                    f"{type(module).__name__} names {type(producer).__name__} as a producer of "
                    "quantized activations, but it has no output_quantization to set"
                )
            code_dtype = _consumer_input_quantization(consumer) if enabled else None
            producer.output_quantization = code_dtype
            num_linked += code_dtype is not None
    return num_linked


def _consumer_input_quantization(consumer: nn.Module) -> torch.dtype | None:
    method = getattr(consumer, "quant_method", None)
    return None if method is None else method.input_quantization(consumer)
