"""Weight-only int8 for the CPU: int8 codes with one float32 scale per output row.

Why this layout and not torch's packed kernels: on the 2-core AVX-512 machine this was built on,
`torch._weight_int8pack_mm` and `torch._weight_int4pack_mm_for_cpu` ran 2-40x slower than the
float32 MKL matmul at batch 1 and 32 (docs/quantization.md has the numbers), whereas converting
int8 codes to float32 a cache-sized chunk at a time and running the MKL matmul on that chunk
reads a quarter of the bytes and beat float32. Decode on the CPU is bound by the bytes of weight
read per step, so the smaller format wins wherever the matmul itself stays on the fast path.

    y = (x @ codes^T) * scale (+ bias),   codes = round(W / scale), scale = max|W_row| / 127
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# float32 elements of weight converted per chunk: 1 MiB, so the chunk stays in L2 while the
# matmul reads it.
CHUNK_ELEMENTS = 1 << 18

QUANTIZATION_METHODS = ("int8",)


def quantize_int8_per_row(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest int8 with one scale per row: (codes int8, scale float32)."""
    weight = weight.float()
    scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    codes = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return codes, scale


def dequantize_int8_per_row(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 weight the codes stand for (the reference of the matmul below)."""
    return codes.float() * scale[:, None]


def int8_weight_matmul(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [tokens, K] @ (codes [N, K] * scale [N, 1])^T (+ bias), converting the codes in chunks of
    rows so that no full float32 copy of the weight is ever made."""
    num_rows, num_cols = codes.shape
    rows_per_chunk = max(1, CHUNK_ELEMENTS // num_cols)
    if num_rows <= rows_per_chunk:
        output = F.linear(x, codes.to(x.dtype))
    else:
        output = torch.cat(
            [
                F.linear(x, codes[start : start + rows_per_chunk].to(x.dtype))
                for start in range(0, num_rows, rows_per_chunk)
            ],
            dim=-1,
        )
    output.mul_(scale.to(x.dtype))
    if bias is not None:
        output.add_(bias)
    return output


def int8_embedding(
    input_ids: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor
) -> torch.Tensor:
    """Rows of an int8 table, dequantized: only the looked-up rows are converted."""
    return codes[input_ids].float() * scale[input_ids, None]


@torch.no_grad()
def quantize_module_weight_(module: nn.Module, method: str) -> None:
    """Replace `module.weight` (a Linear's or an embedding table's) by int8 codes and row scales,
    registered as buffers `weight_codes` and `weight_scale`; the float weight is freed."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(
            f"quantization {method!r} is not supported on the CPU; choose one of "
            f"{', '.join(QUANTIZATION_METHODS)}"
        )
    codes, scale = quantize_int8_per_row(module.weight.data)
    del module.weight
    module.weight = None
    module.register_buffer("weight_codes", codes)
    module.register_buffer("weight_scale", scale)
    module.quantization = method


@torch.no_grad()
def quantize_model_(model: nn.Module, method: str) -> list[str]:
    """Quantize every Linear, the embedding table and an untied LM head of a loaded model in place.
    Returns the names of the quantized modules."""
    from ladle.model.layers.embedding import VocabEmbedding
    from ladle.model.layers.linear import Linear

    quantized = []
    for name, module in model.named_modules():
        if isinstance(module, Linear | VocabEmbedding) and module.weight is not None:
            quantize_module_weight_(module, method)
            quantized.append(name)
    return quantized
