"""Quantizing a loaded model's weights in place (`--quantization int8|int4` on the CPU): the
pass over its Linear layers, embedding table and LM head. The layers' quantized forms and the
matmuls that run them are in quantized_linear.py, which the layers themselves use."""

from __future__ import annotations

import torch
from torch import nn

from ladle.model.layers.activation_outliers import find_outlier_channels
from ladle.model.layers.cpu_int8_gemm import pack_int8_weight, quantized_engine_available
from ladle.model.layers.embedding import LMHead, VocabEmbedding
from ladle.model.layers.group_quant import quantize_int4_groups
from ladle.model.layers.linear import Linear
from ladle.model.layers.quantized_linear import (
    INT4_GROUP_SIZE,
    QUANTIZATION_METHODS,
    quantize_int8_per_row,
)


def quantize_module_weight_(
    module: nn.Module,
    method: str,
    outlier_columns: torch.Tensor | None = None,
    weight_only: bool = False,
) -> None:
    """Replace `module.weight` (a Linear's or an embedding table's) by its quantized form; the
    float weight is freed.

    int8: int8 codes and row scales. On a CPU whose torch has a quantized engine, matmuls run
    int8 x int8 on a packed copy (`module.quantized_weight`, cpu_int8_gemm.py) and the codes are
    kept as buffers `weight_codes`/`weight_scale` only where rows are looked up (the embedding);
    elsewhere the codes feed the chunked float matmul above.
    int4: group-wise int4, group 128, round-to-nearest with scales and zeros (group_quant.py).
    outlier_columns: input channels that the int8 engine path multiplies in float32.
    weight_only: int8 codes feed the chunked float32 matmul even where the engine exists (the
    numerics of `--quantization auto`, which keep quality first).
    """
    if method not in QUANTIZATION_METHODS:
        raise ValueError(
            f"quantization {method!r} is not supported on the CPU; choose one of "
            f"{', '.join(QUANTIZATION_METHODS)}"
        )
    weight = module.weight.data
    del module.weight
    module.weight = None
    module.quantization = method
    module.output_dtype = weight.dtype  # embedding rows come back in the model's dtype
    if method == "int4":
        module.quantized_weight = quantize_int4_groups(weight, INT4_GROUP_SIZE)
        return
    use_engine = not weight_only and weight.device.type == "cpu" and quantized_engine_available()
    outlier_weight = None
    if use_engine and outlier_columns is not None:
        outlier_weight = weight[:, outlier_columns].float().contiguous()
        codes, scale = quantize_int8_per_row(weight.index_fill(1, outlier_columns, 0.0))
    else:
        outlier_columns = None
        codes, scale = quantize_int8_per_row(weight)
    if use_engine:
        module.quantized_weight = pack_int8_weight(codes, scale, outlier_columns, outlier_weight)
        if not isinstance(module, VocabEmbedding) or isinstance(module, LMHead):
            return
        if outlier_columns is not None:
            # Lookups read whole rows: their codes keep every column.
            codes, scale = quantize_int8_per_row(weight)
    del weight
    module.register_buffer("weight_codes", codes)
    module.register_buffer("weight_scale", scale)


@torch.no_grad()
def quantize_model_(model: nn.Module, method: str, weight_only: bool = False) -> list[str]:
    """Quantize every Linear, the embedding table and an untied LM head of a loaded model in
    place, skipping those already quantized (GGUF tensors kept in their own format). Returns
    the names of the modules quantized here."""
    outliers: dict[str, torch.Tensor] = {}
    uses_engine = method == "int8" and not weight_only and quantized_engine_available()
    if uses_engine and hasattr(model, "config"):
        outliers = find_outlier_channels(model, (Linear,))
    quantized = []
    for name, module in model.named_modules():
        if isinstance(module, Linear | VocabEmbedding) and module.weight is not None:
            quantize_module_weight_(module, method, outliers.get(name), weight_only)
            quantized.append(name)
    return quantized
