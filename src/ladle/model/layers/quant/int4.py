"""INT4 weight-only: group-wise round-to-nearest with per-group scales and zero points, group
size 128 along the input dimension, activations left in the model dtype.

    per (row n, group g of 128 inputs), asymmetric (the default):
        lo = min(W, 0), hi = max(W, 0), scale = (hi - lo) / 15, zero = round(-lo / scale) >= 1
    symmetric (GPTQ sym=True): scale = 2 max|W| / 15, zero = 8
        q = clamp(round(W / scale) + zero, 0, 15)          W ~ (q - zero) * scale

Scales are rounded to float16 before the codes are computed, because GPTQ and AWQ checkpoints
store float16 scales: the codes then round-trip through either format exactly. A partial last
group (K not a multiple of 128) is its own group.

Canonical tensors (rows on dim 0): weight_packed int32 [N, ceil(K/8)] (input k in nibble k % 8
of word k // 8, low nibble first), weight_scale float16 [N, G], weight_zero uint8 [N, G].
Runtime on the GPU: the same words transposed to [ceil(K/8), N] and scales/zeros as [G, N] (one
coalesced row of words per 8 inputs), read by the kernels of kernels/int4_decode.py: a
tensor-core-free GEMV and a tl.dot kernel, both with split-K reduced inside the launch, for
decode-sized batches; prefill-sized batches dequantize the weight once (kernels/int4_matmul.py)
and run cuBLAS. Which one runs at which batch size is measured per weight shape at load
(int4_plan.py). On the CPU the same weights become group_quant.py's rows, which ladle's C
kernels multiply without a float32 copy of the weight (dequantizing the whole weight every call
made a loaded int4 folder decode ~25x slower than `--quantization int4`). GPTQ and AWQ
checkpoints reach the same canonical tensors, so they get the same runtime layouts and kernels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ladle.model.layers.group_quant import group_quantized_matmul, group_rows_from_zero_points
from ladle.model.layers.quant.base import QuantMethod, TensorSpec, add_bias, flatten_tokens

GROUP_SIZE = 128
NIBBLES_PER_WORD = 8
# Without a measured plan (a layer finalized off the GPU), calls up to this many tokens use the
# in-kernel dequantizing kernels and bigger ones dequantize the weight and run cuBLAS.
MAX_KERNEL_TOKENS = 64
# float16 scales below this would underflow; weights whose group range is this small lose nothing.
MIN_SCALE = 1e-5


def num_groups(input_size: int, group_size: int = GROUP_SIZE) -> int:
    return -(-input_size // group_size)


def int4_group_params(
    groups: torch.Tensor, symmetric: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero) float32 [..., G] of float32 groups [..., G, group_size], by the rule of the
    module doc; scales are already rounded to float16. Shared by round-to-nearest and by the
    calibrated quantizer (gptq.py), so both write scales and zeros the loader reads the same."""
    if symmetric:
        scale = groups.abs().amax(dim=-1) * (2.0 / 15.0)
        scale = scale.clamp(min=MIN_SCALE).half().float()
        return scale, torch.full_like(scale, 8.0)
    lo = groups.amin(dim=-1).clamp(max=0.0)
    hi = groups.amax(dim=-1).clamp(min=0.0)
    scale = ((hi - lo) * (1.0 / 15.0)).clamp(min=MIN_SCALE).half().float()
    # Zero is kept >= 1 because GPTQ (v1) checkpoints store zero - 1 in a nibble; a group that
    # would need 0 (all weights >= 0) loses one step at its top instead.
    zero = torch.round(-lo / scale).clamp(1, 15)
    return scale, zero


def int4_codes(values: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest codes 0..15 (float32) of values on the grid (code - zero) * scale."""
    return (torch.round(values / scale) + zero).clamp(0, 15)


def quantize_int4_groups(
    weight: torch.Tensor, group_size: int = GROUP_SIZE, symmetric: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K] in 0..15, float16 scale [N, G], uint8 zero [N, G])."""
    weight = weight.float()
    rows, cols = weight.shape
    groups = num_groups(cols, group_size)
    padded = F.pad(weight, (0, groups * group_size - cols)).view(rows, groups, group_size)
    scale, zero = int4_group_params(padded, symmetric)
    codes = int4_codes(padded, scale[..., None], zero[..., None])
    codes = codes.view(rows, -1)[:, :cols].to(torch.uint8)
    return codes, scale.half(), zero.to(torch.uint8)


def pack_int4_rows(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [N, K] -> int32 [N, ceil(K/8)], input k in nibble k % 8 (low first)."""
    rows, cols = codes.shape
    words = -(-cols // NIBBLES_PER_WORD)
    padded = F.pad(codes.to(torch.int64), (0, words * NIBBLES_PER_WORD - cols))
    shifts = torch.arange(0, 32, 4, dtype=torch.int64, device=codes.device)
    packed = (padded.view(rows, words, NIBBLES_PER_WORD) << shifts).sum(dim=-1)
    # Two's complement: the top nibble's high bit is the int32 sign bit.
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)
    return packed.to(torch.int32)


def unpack_int4_rows(packed: torch.Tensor, num_columns: int) -> torch.Tensor:
    """int32 [N, W] -> uint8 codes [N, num_columns] (the inverse of pack_int4_rows)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=packed.device)
    codes = (packed[..., None] >> shifts) & 0xF
    return codes.reshape(packed.shape[0], -1)[:, :num_columns].to(torch.uint8)


def dequantize_int4_groups(
    codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int = GROUP_SIZE
) -> torch.Tensor:
    """float32 [N, K] from codes [N, K], scale and zero [N, G]."""
    cols = codes.shape[1]
    scale_full = scale.float().repeat_interleave(group_size, dim=1)[:, :cols]
    zero_full = zero.float().repeat_interleave(group_size, dim=1)[:, :cols]
    return (codes.float() - zero_full) * scale_full


# Group sizes a checkpoint may bring: GPTQ's and AWQ's 32, 64 and 128 (the kernels take any
# power of two from 16 to 256). `--quantization int4` and `ladle quantize` use GROUP_SIZE.
GROUP_SIZES = (32, 64, 128, 256)


class Int4Method(QuantMethod):
    name = "int4"

    def __init__(self, symmetric: bool = False, group_size: int = GROUP_SIZE) -> None:
        if group_size not in GROUP_SIZES:
            raise ValueError(f"int4 group size {group_size} is not one of {GROUP_SIZES}")
        self.symmetric = symmetric
        self.group_size = group_size

    def canonical_specs(self, output_size: int, input_size: int) -> dict[str, TensorSpec]:
        groups = num_groups(input_size, self.group_size)
        words = -(-input_size // NIBBLES_PER_WORD)
        return {
            "weight_packed": ((output_size, words), torch.int32),
            "weight_scale": ((output_size, groups), torch.float16),
            "weight_zero": ((output_size, groups), torch.uint8),
        }

    def quantize(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, scale, zero = quantize_int4_groups(weight, self.group_size, self.symmetric)
        return {"weight_packed": pack_int4_rows(codes), "weight_scale": scale, "weight_zero": zero}

    def dequantize(self, tensors: dict[str, torch.Tensor], input_size: int) -> torch.Tensor:
        codes = unpack_int4_rows(tensors["weight_packed"], input_size)
        scale, zero = tensors["weight_scale"], tensors["weight_zero"]
        return dequantize_int4_groups(codes, scale, zero, self.group_size)

    def finalize(self, layer: nn.Module) -> None:
        """Build the runtime layout and drop the canonical copies: on the GPU the kernels' ([K/8,
        N] words, [G, N] scales and zeros); on the CPU the group-quantized rows its C kernels
        read (`quantized_weight`, group_quant.py), the same float32 weights."""
        packed = layer.weight_packed.data
        layer.int4_plan = None
        if not packed.is_cuda:
            codes = unpack_int4_rows(packed, layer.input_size)
            layer.quantized_weight = group_rows_from_zero_points(
                codes, layer.weight_scale.data, layer.weight_zero.data, self.group_size
            )
            del layer.weight_packed, layer.weight_scale, layer.weight_zero
            return
        layer.register_buffer("packed_t", packed.t().contiguous())
        layer.register_buffer("scale_t", layer.weight_scale.data.t().contiguous())
        layer.register_buffer("zero_t", layer.weight_zero.data.t().to(torch.float16).contiguous())
        del layer.weight_packed, layer.weight_scale, layer.weight_zero
        # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
        # triton; tests/model/test_fused_kernel_dispatch.py).
        from ladle.model.layers.quant.int4_plan import plan_for

        dtype = layer.bias.dtype if layer.bias is not None else torch.bfloat16
        layer.int4_plan = plan_for(
            layer.packed_t, layer.scale_t, layer.zero_t, self.group_size, layer.input_size, dtype
        )

    def apply(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        x2, leading = flatten_tokens(x)
        if x.is_cuda:
            num_tokens = x2.shape[0]
            plan = getattr(layer, "int4_plan", None)
            if plan is not None:
                kernel = plan.kernel_for(num_tokens)
                in_kernel = kernel is not None
            else:
                kernel, in_kernel = None, num_tokens <= MAX_KERNEL_TOKENS
            if in_kernel:
                # Imported here: a Triton kernel's file loads only once it runs (a CPU install has
                # no triton; tests/model/test_fused_kernel_dispatch.py).
                from ladle.kernels.int4_decode import int4_decode_matmul

                output = int4_decode_matmul(
                    x2, layer.packed_t, layer.scale_t, layer.zero_t, self.group_size, kernel
                )
                output = add_bias(output, layer.bias)
            else:
                # Imported here: a Triton kernel's file loads only once it runs (a CPU install has
                # no triton; tests/model/test_fused_kernel_dispatch.py).
                from ladle.kernels.int4_matmul import int4_dequantize

                weight_t = int4_dequantize(
                    layer.packed_t,
                    layer.scale_t,
                    layer.zero_t,
                    self.group_size,
                    layer.input_size,
                    x.dtype,
                )
                output = add_bias(x2 @ weight_t, layer.bias)
        else:
            output = group_quantized_matmul(x2, layer.quantized_weight, layer.bias)
        return output.reshape(*leading, -1)
