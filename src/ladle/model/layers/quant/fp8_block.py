"""Block-scaled FP8 W8A8, the layout of DeepSeek-V3's and Qwen3-*-FP8's checkpoints (Hugging Face
`quant_method: "fp8"` with `weight_block_size: [128, 128]`, compressed-tensors' `block`
strategy): e4m3 weights with one float32 scale per block of rows x inputs, and activations
quantized per token and group of the block's width (128) on the fly, as vLLM runs those
checkpoints.

Canonical layout (output rows on dim 0, so merged q/k/v and gate/up load by row slices):
`weight` e4m3 [N, K] and `weight_scale` float32 [N, G], one scale per row and block width of
inputs (G = ceil(K / 128) for 128-wide blocks), each block's scale repeated over its rows.
That holds a checkpoint's block scales exactly, where reading them as per-channel fp8 rounded
every weight to e4m3 a second time.

    y[m, n] = sum_g (x8[m, g] . W8[n, g]) * x_scale[m, g] * w_scale[n, g]

On the GPU, 128x128 blocks whose projections are whole blocks (inputs a multiple of 512) run
through cuBLASLt's block-scaled GEMM (torch._scaled_mm, Hopper with CUDA 12.9+), except
projections of fewer than 8192 inputs at decode sizes; those, and other block sizes, run through
kernels/fp8_matmul.py's grouped tiles (Ada or newer; older GPUs dequantize per call), except one
row (batch-1 decode), which takes the fp8 GEMV with the block scales and x unquantized
(fp8_one_row.py). The CPU
has no fp8 matmul: the weight is dequantized to float32 once at load, and the activations are
quantized by the same rule (kernels/per_token_rule.py), so it computes the GPU's numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ladle.model.layers.quant.base import QuantMethod, TensorSpec, add_bias, flatten_tokens
from ladle.model.layers.quant.fp8 import FP8_DTYPE, FP8_MAX, MIN_SCALE
from ladle.model.layers.quant.fp8_one_row import (
    can_run_fp8_gemv,
    one_row_gate_up_silu,
    one_row_matmul,
)

# Block widths (inputs) ladle runs: one K step of the GPU kernel each, so a power of two.
BLOCK_COLUMNS = (32, 64, 128, 256)


def num_scale_groups(num_inputs: int, block_columns: int) -> int:
    return -(-num_inputs // block_columns)


def check_block_size(block_rows: int, block_columns: int) -> None:
    """ValueError unless ladle runs blocks of this size."""
    if block_rows < 1 or block_columns not in BLOCK_COLUMNS:
        raise ValueError(
            f"fp8 weight block {block_rows} x {block_columns} is not supported: ladle runs blocks "
            f"of any number of rows by {', '.join(map(str, BLOCK_COLUMNS))} inputs"
        )


def group_scales_from_blocks(
    block_scale: torch.Tensor, num_rows: int, block_rows: int
) -> torch.Tensor:
    """Block scales [ceil(N / block_rows), G] as the canonical per-row scales [N, G]."""
    return block_scale.float().repeat_interleave(block_rows, dim=0)[:num_rows].contiguous()


def blocks_from_group_scales(scale: torch.Tensor, block_rows: int) -> torch.Tensor:
    """The block scales [ceil(N / block_rows), G] that canonical scales made by
    group_scales_from_blocks repeat (each block's first row)."""
    return scale[::block_rows].contiguous()


def expand_groups(scale: torch.Tensor, num_inputs: int, block_columns: int) -> torch.Tensor:
    """Per-row, per-group scales [N, G] as one scale per weight [N, K] (groups of
    block_columns inputs, the last one possibly partial)."""
    return scale.repeat_interleave(block_columns, dim=1)[:, :num_inputs]


def quantize_fp8_blocks(
    weight: torch.Tensor, block_rows: int, block_columns: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 codes [N, K], canonical scales [N, G]) with each block's max |w| mapped to 448."""
    weight = weight.float()
    num_rows, num_inputs = weight.shape
    padded = F.pad(weight.abs(), (0, -num_inputs % block_columns, 0, -num_rows % block_rows))
    blocks = padded.view(padded.shape[0] // block_rows, block_rows, -1, block_columns)
    # Times the reciprocal, as quantize_fp8_per_row: the same bits on the CPU and the GPU.
    block_scale = (blocks.amax(dim=(1, 3)) * (1.0 / FP8_MAX)).clamp(min=MIN_SCALE)
    scale = group_scales_from_blocks(block_scale, num_rows, block_rows)
    codes = (
        (weight / expand_groups(scale, num_inputs, block_columns))
        .clamp(-FP8_MAX, FP8_MAX)
        .to(FP8_DTYPE)
    )
    return codes, scale


def _fp8_kernels_run_on(device: torch.device) -> bool:
    """Triton's e4m3 dot products need Ada (sm_89) or newer."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


# cuBLASLt's block-scaled GEMM (torch._scaled_mm with 1x128 activation groups and 128x128
# weight blocks; CUDA 12.9+ on Hopper) against ladle's grouped Triton tiles, per projection of
# the 8B shape on an H100 (scripts/fp8_block_bench.py, round 46; docs/benchmarks.md): from 64
# rows on cuBLASLt wins everywhere (4096 rows: qkv 248 us against 676, level with bf16's 260);
# up to 16 rows the Triton tiles win the projections of 4096 inputs (qkv 16.4 against 19.0 us,
# gate_up 49 against 53 at one row) and lose the deep one (down, 14336 inputs: 88 against 36).
# torch 2.11 takes the weight scales only as [K/128, N/128] with 16-byte aligned columns, so
# K/128 must be a multiple of 4 (K % 512 == 0); its per-row 1x128 weight recipe is refused.
CUBLAS_BLOCK = 128
CUBLAS_INPUT_MULTIPLE = 4 * CUBLAS_BLOCK
TRITON_MAX_ROWS = 16
DEEP_INPUTS = 8192
_block_scaled_mm_works: dict[torch.device, bool] = {}


def can_use_block_scaled_mm(device: torch.device) -> bool:
    """Whether torch._scaled_mm takes 1x128 x 128x128 block scales here: probed once per device,
    outside any graph capture (finalize runs at load)."""
    if device.type != "cuda":
        return False
    if device not in _block_scaled_mm_works:
        try:
            # One row of 128x128 weight blocks (cuBLASLt refuses N < 128) and 4 rows.
            inputs = CUBLAS_INPUT_MULTIPLE
            weight = torch.ones(CUBLAS_BLOCK, inputs, device=device)
            codes, scale = quantize_fp8_blocks(weight, CUBLAS_BLOCK, CUBLAS_BLOCK)
            scale_b = cublas_weight_scales(scale, CUBLAS_BLOCK, CUBLAS_BLOCK)
            x = torch.ones(4, inputs, device=device, dtype=torch.bfloat16)
            out = block_scaled_mm(x, codes, scale_b)
            _block_scaled_mm_works[device] = bool((out == inputs).all().item())
        except (RuntimeError, TypeError, ValueError):
            _block_scaled_mm_works[device] = False
    return _block_scaled_mm_works[device]


def cublas_weight_scales(scale: torch.Tensor, block_rows: int, block_columns: int):
    """The weight scales as cuBLASLt's 128x128 recipe takes them ([K/128, N/128], column-major),
    or None when it cannot: canonical scales that are not whole 128x128 blocks (other block
    sizes, sizes off 128, a merged q/k/v whose parts end mid-block) or K not a multiple of 512."""
    num_rows, num_groups = scale.shape
    if (block_rows, block_columns) != (CUBLAS_BLOCK, CUBLAS_BLOCK) or num_rows % CUBLAS_BLOCK:
        return None
    if num_groups % (CUBLAS_INPUT_MULTIPLE // CUBLAS_BLOCK):
        return None
    blocks = blocks_from_group_scales(scale, CUBLAS_BLOCK)
    if not torch.equal(group_scales_from_blocks(blocks, num_rows, CUBLAS_BLOCK), scale):
        return None
    return blocks.t()  # [K/128, N/128], column-major


def block_scaled_mm(x2: torch.Tensor, weight: torch.Tensor, weight_scale_b: torch.Tensor):
    """x2 [M, K] bf16 -> [M, N] bf16 through cuBLASLt's block-scaled GEMM: activations quantized
    per token and group of 128 (rows padded to a multiple of 4, as cuBLASLt needs)."""
    # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no triton;
    # tests/model/test_fused_kernel_dispatch.py).
    from ladle.kernels.per_token_quant import per_group_quant

    num_rows = x2.shape[0]
    padding = -num_rows % 4
    if padding:
        x2 = F.pad(x2, (0, 0, 0, padding))
    codes, scale = per_group_quant(x2, FP8_DTYPE, CUBLAS_BLOCK)
    output = torch._scaled_mm(
        codes,
        weight.t(),
        scale_a=scale.t().contiguous().t(),
        scale_b=weight_scale_b,
        out_dtype=torch.bfloat16,
    )
    return output[:num_rows] if padding else output


class Fp8BlockMethod(QuantMethod):
    """fp8 weights with block scales; `block_rows` x `block_columns` is the block quantize()
    makes (a checkpoint's own blocks arrive already expanded to the canonical layout)."""

    name = "fp8"

    def __init__(self, block_rows: int = 128, block_columns: int = 128) -> None:
        check_block_size(block_rows, block_columns)
        self.block_rows = block_rows
        self.block_columns = block_columns

    def canonical_specs(self, output_size: int, input_size: int) -> dict[str, TensorSpec]:
        return {
            "weight": ((output_size, input_size), FP8_DTYPE),
            "weight_scale": (
                (output_size, num_scale_groups(input_size, self.block_columns)),
                torch.float32,
            ),
        }

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, scale = quantize_fp8_blocks(weight, self.block_rows, self.block_columns)
        return {"weight": codes, "weight_scale": scale}

    def dequantize(self, tensors: dict[str, torch.Tensor], input_size: int) -> torch.Tensor:
        scale = expand_groups(tensors["weight_scale"], input_size, self.block_columns)
        return tensors["weight"].float() * scale

    def finalize(self, layer: nn.Module) -> None:
        weight = layer.weight.data
        layer.use_fp8_kernel = _fp8_kernels_run_on(weight.device)
        layer.runs_fp8_gemv = can_run_fp8_gemv(weight.device)
        layer.cublas_weight_scale = None
        if layer.use_fp8_kernel and can_use_block_scaled_mm(weight.device):
            layer.cublas_weight_scale = cublas_weight_scales(
                layer.weight_scale.data, self.block_rows, self.block_columns
            )
        if not weight.is_cuda:
            # No fp8 matmul on the CPU: dequantized once here, as Fp8Method does.
            canonical = {"weight": weight, "weight_scale": layer.weight_scale.data}
            dequantized = self.dequantize(canonical, weight.shape[1])
            del canonical, layer.weight, layer.weight_scale
            layer.weight = None
            layer.register_buffer("weight_dequantized", dequantized)

    def gate_up_silu(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
        return one_row_gate_up_silu(layer, x, self.block_columns)

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        output = one_row_matmul(layer, x, self.block_columns)  # one row on CUDA, else None
        if output is not None:
            return output
        x2, leading = flatten_tokens(x)
        decode_tiles_win = x2.shape[0] <= TRITON_MAX_ROWS and x2.shape[1] < DEEP_INPUTS
        if layer.cublas_weight_scale is not None and not decode_tiles_win:
            output = block_scaled_mm(x2, layer.weight, layer.cublas_weight_scale).to(x.dtype)
            return add_bias(output, layer.bias).reshape(*leading, -1)
        if layer.use_fp8_kernel:
            # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
            # triton; tests/model/test_fused_kernel_dispatch.py).
            from ladle.kernels.fp8_matmul import fp8_matmul, grouped_tile
            from ladle.kernels.per_token_quant import per_group_quant

            codes, scale = per_group_quant(x2, FP8_DTYPE, self.block_columns)
            tile = grouped_tile(codes.shape[0], layer.weight.shape[0], self.block_columns)
            output = fp8_matmul(
                codes, layer.weight, scale, layer.weight_scale, tile, x.dtype, grouped=True
            )
            return add_bias(output, layer.bias).reshape(*leading, -1)
        # Imported here, as fp8.py does: ladle.kernels stays off the CPU's import path until an
        # fp8 layer runs there (tests/model/test_fused_kernel_dispatch.py).
        from ladle.kernels.per_token_rule import per_group_quant_reference

        codes, scale = per_group_quant_reference(x2, FP8_DTYPE, self.block_columns)
        num_inputs = x2.shape[1]
        activation = codes.float() * expand_groups(scale, num_inputs, self.block_columns)
        if x2.is_cuda:  # a GPU without fp8 dot products: dequantize the weight for this call
            weight = self.dequantize(
                {"weight": layer.weight, "weight_scale": layer.weight_scale}, num_inputs
            )
        else:
            weight = layer.weight_dequantized
        bias = None if layer.bias is None else layer.bias.float()
        output = add_bias(activation @ weight.t(), bias)
        return output.to(x.dtype).reshape(*leading, -1)
