"""int8 x int8 matmuls on the CPU through torch's quantized engine (fbgemm / oneDNN, VNNI).

Weight-only int8 that converts codes to float32 before an MKL matmul spends most of a decode step
converting (42% of the step in `aten::copy_`, measured); the quantized engine multiplies int8
weights by activations quantized on the fly, reading one byte per weight and no float copy, and
measured 4-10x faster than the float32 MKL matmul at batch 1 and 32 (docs/quantization.md).

Activations are quantized per token: the engine's dynamic linear quantizes its whole input with
one scale, so each token's row is first divided by its own absolute maximum and the output row
multiplied back (exact, since the matmul is linear in each row):

    y[t] = amax(x[t]) * dynamic_int8_linear(x[t] / amax(x[t]), codes, scale) (+ bias)

A few input channels with outlier activations (found at load, activation_outliers.py) are taken
out of x and multiplied in float32, so they do not set every token's scale.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedInt8Weight:
    """An int8 weight [N, K] with per-row scales, packed for the CPU quantized engine."""

    packed: torch.ScriptObject
    num_rows: int
    num_columns: int
    # Input channels multiplied in float32 (activation_outliers.py): their indices, and the
    # float weight columns transposed, [len(indices), N] (the operand addmm takes); the packed
    # codes hold zeros there.
    outlier_columns: torch.Tensor | None = None
    outlier_weight_t: torch.Tensor | None = None

    @property
    def num_bytes(self) -> int:
        # The packed layout holds the int8 codes plus one float scale per row (and small column
        # offsets); count what it must at least hold.
        outlier_bytes = 0 if self.outlier_weight_t is None else self.outlier_weight_t.numel() * 4
        return self.num_rows * (self.num_columns + 4) + outlier_bytes


# fbgemm (the engine's x86 kernels) can be held to a lower instruction set by this variable
# (tests use it to run the AVX2 kernels on any machine); these values leave out its VNNI ones.
FBGEMM_ISA_ENV = "FBGEMM_ENABLE_INSTRUCTIONS"
FBGEMM_ISAS_WITHOUT_VNNI = ("AVX2", "AVX512", "AVX512_256")


@functools.cache
def engine_has_vnni() -> bool:
    """Whether the engine's kernels multiply u8 x s8 pairs into int32 without saturating: fbgemm
    does so only with AVX-512 VNNI (vpdpbusd). Its AVX2 and AVX-512 kernels (vpmaddubsw) add two
    u8 x s8 products in a saturating int16, which full 8-bit activations overflow (255 * 127 *
    2 > 32767), so there activations keep 7 bits (reduce_range): the quantization step is twice
    as coarse, and results are further from float than on a VNNI machine (docs/benchmarks.md,
    2026-11-28). fbgemm has no AVX-VNNI (256-bit, Intel client CPUs) kernels: those CPUs run its
    AVX2 ones and need the 7 bits too."""
    if os.environ.get(FBGEMM_ISA_ENV, "").upper() in FBGEMM_ISAS_WITHOUT_VNNI:
        return False
    try:
        with open("/proc/cpuinfo") as file:
            flags = file.read()
    except OSError:
        return False
    return "avx512_vnni" in flags


@functools.cache
def quantized_engine_available() -> bool:
    """Whether this torch build has a CPU quantized engine that packs int8 linear weights."""
    try:
        probe = pack_int8_weight(torch.ones(2, 4, dtype=torch.int8), torch.ones(2))
        output = int8_dynamic_linear(torch.ones(1, 4), probe)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False
    return bool(torch.allclose(output, torch.full((1, 2), 4.0), rtol=0.02))


def pack_int8_weight(
    codes: torch.Tensor,
    scale: torch.Tensor,
    outlier_columns: torch.Tensor | None = None,
    outlier_weight: torch.Tensor | None = None,
) -> PackedInt8Weight:
    """Pack int8 codes [N, K] with float32 row scales [N] for `int8_dynamic_linear`; the
    optional outlier columns (indices, float weight [N, count]) are multiplied in float32."""
    outlier_weight_t = None if outlier_weight is None else outlier_weight.T.contiguous()
    num_rows, num_columns = codes.shape
    with warnings.catch_warnings():
        # torch marks its quantized tensor types deprecated; the CPU engine behind them is the
        # fastest int8 matmul torch ships for x86 and ARM.
        warnings.simplefilter("ignore")
        quantized = torch._make_per_channel_quantized_tensor(
            codes.contiguous(),
            scale.double().contiguous(),
            torch.zeros(num_rows, dtype=torch.long),
            0,
        )
        packed = torch.ops.quantized.linear_prepack(quantized, None)
    return PackedInt8Weight(packed, num_rows, num_columns, outlier_columns, outlier_weight_t)


def int8_dynamic_linear(
    x: torch.Tensor, weight: PackedInt8Weight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] float32 @ weight^T (+ bias), activations quantized to int8 per token.

    A decode step runs this ~120 times on a one-row x, so the row's path is a handful of ops:
    no reshapes or casts when x is already a float32 matrix, index_select (not advanced
    indexing) for the outlier columns, and their product added by addmm."""
    leading, input_dtype = x.shape[:-1], x.dtype
    if x.dim() != 2 or x.dtype != torch.float32:
        x = x.reshape(-1, weight.num_columns).float()
    reduce_range = not engine_has_vnni()
    outlier_columns = weight.outlier_columns
    if outlier_columns is not None:
        outlier_input = x.index_select(1, outlier_columns)
        x = x.index_fill(1, outlier_columns, 0.0)
    if x.shape[0] == 1:
        # One token: the engine's per-tensor scale is already per token.
        output = torch.ops.quantized.linear_dynamic(x, weight.packed, reduce_range)
    else:
        token_max = x.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30)
        output = torch.ops.quantized.linear_dynamic(x / token_max, weight.packed, reduce_range)
        output.mul_(token_max)
    if outlier_columns is not None:
        output.addmm_(outlier_input, weight.outlier_weight_t)
    if bias is not None:
        output.add_(bias)
    if len(leading) != 1 or input_dtype != torch.float32:
        output = output.reshape(*leading, weight.num_rows).to(input_dtype)
    return output
