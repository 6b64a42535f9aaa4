"""Quantized weights on the CPU: which format a module holds, and the matmul that runs it.

    int8 (weight-only, what --quantization auto runs for a GGUF): int8 codes, one float32 scale
        per output row; codes converted to float32 one cache-sized chunk of rows at a time, then
        MKL, so no full float32 copy of any weight exists.
            y = (x @ codes^T) * scale (+ bias),   codes = round(W / scale), scale = max|W_row| / 127
    int8 (--quantization int8): the same codes, packed for torch's quantized engine and
        multiplied int8 x int8 with per-token activation scales (cpu_int8_gemm.py), outlier
        input channels in float32 (activation_outliers.py).
    int4 (--quantization int4) and GGUF blocks kept in their format (--quantization gguf):
        group-wise codes with float scales and offsets (group_quant.py).

docs/quantization.md has the measurements behind each choice.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ladle.kernels.cpu_native.gemv import int8_rows_gemv
from ladle.model.layers.cpu_int8_gemm import (
    PackedInt8Weight,
    int8_dynamic_linear,
)
from ladle.model.layers.group_quant import (
    GroupQuantizedRows,
    group_quantized_embedding,
    group_quantized_matmul,
    stack_rows,
)
from ladle.model.load_errors import ModelLoadError

# float32 elements of weight converted per chunk: 1 MiB, so the chunk stays in L2 while the
# matmul reads it.
CHUNK_ELEMENTS = 1 << 18

QUANTIZATION_METHODS = ("int8", "int4")
INT4_GROUP_SIZE = 128


def quantize_int8_per_row(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric round-to-nearest int8 with one scale per row: (codes int8, scale float32)."""
    weight = weight.float()
    scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    codes = torch.round(weight / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return codes, scale


def dequantize_int8_per_row(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The float32 weight the codes stand for (the reference of the matmul below)."""
    return codes.float() * scale[:, None]


# Up to this many rows (decode of one or a few sequences) the weight-only int8 matmul runs on
# torch's int8-weight GEMV (`_weight_int8pack_mm`, bfloat16 activations), which reads the codes
# once; more rows amortise converting the codes to float32 for MKL, which is then faster.
GEMV_MAX_ROWS = 4
# The GEMV reads K in vectors of 16: other K give wrong sums or crash (torch 2.13, measured).
GEMV_COLUMN_MULTIPLE = 16


@functools.cache
def _unit_scales(num_rows: int) -> torch.Tensor:
    return torch.ones(num_rows, dtype=torch.bfloat16)


@functools.cache
def int8_gemv_available() -> bool:
    """Whether this torch build has the CPU int8-weight GEMV, and it computes correctly."""
    try:
        codes = torch.arange(-16, 16, dtype=torch.int8).view(2, GEMV_COLUMN_MULTIPLE)
        ones = torch.ones(1, GEMV_COLUMN_MULTIPLE, dtype=torch.bfloat16)
        output = torch._weight_int8pack_mm(ones, codes, _unit_scales(2))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return output.float().tolist() == [[-136.0, 120.0]]


def int8_weight_matmul(
    x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [tokens, K] @ (codes [N, K] * scale [N, 1])^T (+ bias). Up to GEMV_MAX_ROWS rows: the
    int8-weight GEMV on bfloat16 activations, the float32 row scales applied to its output (a
    decode step's ~120 matmuls at 2-3x the rate of converting codes); more rows: the codes
    converted in chunks of rows for MKL, so that no full float32 copy of the weight is made.
    Where torch's GEMV does not apply (K not a multiple of 16, or a torch without it), ladle's C
    kernel (kernels/cpu_native/gemv.py) takes those rows: float32 activations, any K; it
    measured ~25% slower than torch's bfloat16 one where both apply, hence second."""
    num_rows, num_cols = codes.shape
    fits_gemv = num_cols % GEMV_COLUMN_MULTIPLE == 0 and codes.device.type == "cpu"
    if fits_gemv and x.dim() == 2 and x.shape[0] <= GEMV_MAX_ROWS:
        if int8_gemv_available():
            output = torch._weight_int8pack_mm(x.to(torch.bfloat16), codes, _unit_scales(num_rows))
            output = output.to(x.dtype).mul_(scale)
            return output if bias is None else output.add_(bias)
    if x.dim() == 2 and x.shape[0] <= GEMV_MAX_ROWS:
        output = int8_rows_gemv(x, codes, scale, bias)
        if output is not None:
            return output
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
def set_group_quantized_weight_(module: nn.Module, weight: GroupQuantizedRows) -> None:
    """Make `module` run on an already group-quantized weight (a GGUF tensor kept in its own
    format); its float weight is freed."""
    module.output_dtype = module.weight.dtype
    del module.weight
    module.weight = None
    module.quantization = f"int{weight.bits}-g{weight.group_size}"
    module.quantized_weight = weight


def hold_quantized_rows(
    module: nn.Module,
    param: nn.Parameter,
    rows: GroupQuantizedRows,
    start: int,
    num_rows: int,
    num_columns: int,
) -> None:
    """Keep a group-quantized checkpoint tensor for rows start..start+num_rows of `module`'s
    weight until `adopt_native_weights_`; raises ModelLoadError when it does not fit."""
    if param is not module.weight:
        raise ModelLoadError("a quantized tensor can only fill a weight, not a bias")
    if (rows.num_rows, rows.num_columns) != (num_rows, num_columns):
        raise ModelLoadError(
            f"shape {(rows.num_rows, rows.num_columns)} does not fit {(num_rows, num_columns)}"
        )
    module.__dict__.setdefault("pending_quantized_rows", {})[start] = rows


@torch.no_grad()
def adopt_native_weights_(model: nn.Module) -> tuple[list[str], list[str]]:
    """After loading, give each module whose checkpoint tensors came group-quantized its kept
    weight. A merged layer whose shards have different layouts (Q4_K q with Q6_K v, or one shard
    in float) gets all its shards dequantized into its float weight instead.
    Returns (names kept in their format, names dequantized)."""
    kept, dequantized = [], []
    for name, module in model.named_modules():
        pending = module.__dict__.pop("pending_quantized_rows", None)
        if not pending:
            continue
        blocks = [pending[start] for start in sorted(pending)]
        covers_all = sum(block.num_rows for block in blocks) == module.weight.shape[0]
        if covers_all and len({block.layout for block in blocks}) == 1:
            set_group_quantized_weight_(module, stack_rows(blocks))
            kept.append(name)
            continue
        for start, block in pending.items():
            module.weight.data[start : start + block.num_rows].copy_(block.dequantize())
        dequantized.append(name)
    return kept, dequantized


def quantized_matmul(
    module: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ the quantized weight of `module`^T (+ bias), by the kernel of its layout."""
    weight = getattr(module, "quantized_weight", None)
    if isinstance(weight, PackedInt8Weight):
        return int8_dynamic_linear(x, weight, bias)
    if isinstance(weight, GroupQuantizedRows):
        return group_quantized_matmul(x, weight, bias)
    return int8_weight_matmul(x, module.weight_codes, module.weight_scale, bias)


def quantized_embedding(module: nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    """Rows of a quantized embedding table."""
    weight = getattr(module, "quantized_weight", None)
    if isinstance(weight, GroupQuantizedRows):
        rows = group_quantized_embedding(input_ids, weight)
    else:
        rows = int8_embedding(input_ids.long(), module.weight_codes, module.weight_scale)
    return rows.to(getattr(module, "output_dtype", rows.dtype))
