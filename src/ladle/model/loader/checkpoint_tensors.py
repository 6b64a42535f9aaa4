"""Tensor conversions the quantized checkpoint formats share (quantized_formats.py,
compressed_tensors.py, quantized_writer.py): 4-bit codes packed eight to an int32 word, fp8
weights with any of the scale layouts in use, and the checks that name a bad tensor."""

from __future__ import annotations

import torch

from ladle.model.layers.quant import get_quant_method
from ladle.model.layers.quant.fp8 import FP8_DTYPE
from ladle.model.layers.quant.fp8_block import group_scales_from_blocks
from ladle.model.layers.quant.int4 import GROUP_SIZE, pack_int4_rows, unpack_int4_rows
from ladle.model.loader.errors import ModelLoadError

# GPTQ's and AWQ's group_size for one group per output channel (compressed-tensors: strategy
# "channel").
PER_CHANNEL = -1


def pack_rows(codes: torch.Tensor, order: tuple[int, ...] = tuple(range(8))) -> torch.Tensor:
    """uint8 [R, C] codes -> int32 [R, ceil(C/8)]: nibble i of a word holds column order[i]."""
    rows, cols = codes.shape
    words = -(-cols // 8)
    padded = torch.nn.functional.pad(codes.to(torch.int64), (0, words * 8 - cols))
    padded = padded.view(rows, words, 8)[:, :, list(order)]
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    packed = (padded << shifts).sum(dim=-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_rows(
    packed: torch.Tensor, num_columns: int, order: tuple[int, ...] = tuple(range(8))
) -> torch.Tensor:
    """The inverse of pack_rows: int32 [R, W] -> uint8 [R, num_columns]."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed[..., None] >> shifts) & 0xF  # [R, W, 8], nibble i
    columns = torch.empty_like(nibbles)
    columns[:, :, list(order)] = nibbles
    return columns.reshape(packed.shape[0], -1)[:, :num_columns].to(torch.uint8)


def expect_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...], why: str) -> None:
    """ModelLoadError naming the tensor when its shape is not `shape`."""
    if tuple(tensor.shape) != shape:
        raise ModelLoadError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}; expected {shape} ({why})"
        )


def fp8_canonical(
    prefix: str, parts: dict[str, torch.Tensor], block_size: tuple[int, int] | None = None
) -> dict[str, torch.Tensor]:
    """ladle's fp8 tensors of a checkpoint's e4m3 `weight`: with `block_size` (the config's
    weight blocks) its block scales (`weight_scale_inv`, or compressed-tensors' `weight_scale`)
    kept exactly as quant/fp8_block.py's per-row, per-group scales; else per-channel or
    per-tensor scales (expanded exactly), or block scales a config did not announce, which are
    dequantized and re-quantized per channel (not exact)."""
    weight = parts["weight"]
    rows, cols = weight.shape
    if weight.dtype != FP8_DTYPE:
        raise ModelLoadError(
            f"tensor {prefix + 'weight'!r} is {weight.dtype}; an fp8 checkpoint stores {FP8_DTYPE}"
        )
    if block_size is not None:
        name = "weight_scale_inv" if "weight_scale_inv" in parts else "weight_scale"
        block_rows, block_cols = block_size
        expected = (-(-rows // block_rows), -(-cols // block_cols))
        expect_shape(prefix + name, parts[name], expected, f"{block_rows}x{block_cols} blocks")
        scale = group_scales_from_blocks(parts[name], rows, block_rows)
        return {"weight": weight, "weight_scale": scale}
    if "weight_scale_inv" in parts:  # blocks without weight_block_size: one scale per row
        scale = parts["weight_scale_inv"].float()
        block_rows, block_cols = -(-rows // scale.shape[0]), -(-cols // scale.shape[-1])
        full = scale.repeat_interleave(block_rows, 0)[:rows].repeat_interleave(block_cols, 1)
        return get_quant_method("fp8").quantize(weight.float() * full[:, :cols])
    scale = per_row_scale(prefix + "weight_scale", parts["weight_scale"], weight.shape)
    return {"weight": weight, "weight_scale": scale}


def per_row_scale(
    name: str, scale: torch.Tensor, weight_shape: tuple[int, ...] | torch.Size
) -> torch.Tensor:
    """A per-channel ([N] or [N, 1]) or per-tensor ([] or [1], expanded exactly) scale of a
    weight [N, K] as ladle's float32 [N]; ModelLoadError naming the tensor otherwise."""
    rows = weight_shape[0]
    scale = scale.float()
    if scale.numel() == 1:
        return scale.reshape(1).expand(rows).contiguous()
    if tuple(scale.shape) in ((rows,), (rows, 1)):
        return scale.reshape(rows).contiguous()
    raise ModelLoadError(
        f"tensor {name!r} has shape {tuple(scale.shape)}; expected ({rows},), ({rows}, 1) or one "
        f"value for weight {tuple(weight_shape)}"
    )


def check_g_idx(name: str, g_idx: torch.Tensor, group_size: int = GROUP_SIZE) -> None:
    """ModelLoadError unless input k belongs to group k // group_size (no act-order
    reordering)."""
    if not torch.equal(g_idx.long(), torch.arange(g_idx.numel()) // group_size):
        raise ModelLoadError(
            f"tensor {name!r} reorders groups (act-order) where the config says it does not; "
            f"ladle needs k // {group_size}"
        )


def group_order(
    name: str, g_idx: torch.Tensor, group_size: int = GROUP_SIZE
) -> torch.Tensor | None:
    """For an act-order checkpoint (quant/act_order.py): the permutation that puts the inputs in
    group order (int64 [K]), None when they already are (g_idx = k // group_size);
    ModelLoadError naming the tensor unless every group then holds group_size inputs (the last
    one fewer)."""
    g_idx = g_idx.long()
    in_order = torch.arange(g_idx.numel()) // group_size
    if torch.equal(g_idx, in_order):
        return None
    permutation = torch.sort(g_idx, stable=True).indices
    if not torch.equal(g_idx[permutation], in_order):
        raise ModelLoadError(
            f"tensor {name!r} does not put {group_size} inputs in each group (its group sizes "
            f"are {torch.bincount(g_idx).tolist()[:8]}...); ladle runs act-order groups of the "
            "config's group_size"
        )
    return permutation


def permute_packed_inputs(packed: torch.Tensor, num_inputs: int, permutation: torch.Tensor):
    """Canonical int4 words [N, ceil(K/8)] with their inputs reordered: input i of the result is
    input permutation[i] of `packed`."""
    codes = unpack_int4_rows(packed, num_inputs)
    return pack_int4_rows(codes[:, permutation].contiguous())


def int4_input_order(
    name: str,
    g_idx: torch.Tensor | None,
    packed: torch.Tensor,
    num_inputs: int,
    group_size: int,
    act_order: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """An int4 projection's canonical words [N, ceil(K/8)] with the inputs in group order, and
    for an act-order checkpoint the permutation the layer gathers its input by (the identity
    when g_idx is in order, or per channel where there are no groups to order: a merged layer's
    parts must agree, so every part brings one); None for a checkpoint that is not act-order,
    whose g_idx (named `name`, if stored) must be k // group_size."""
    if group_size == PER_CHANNEL:  # one group: no order of groups to keep, whatever g_idx says
        return packed, torch.arange(num_inputs) if act_order else None
    if not act_order:
        if g_idx is not None:
            check_g_idx(name, g_idx, group_size)
        return packed, None
    if tuple(g_idx.shape) != (num_inputs,):
        raise ModelLoadError(
            f"tensor {name!r} has shape {tuple(g_idx.shape)}; expected ({num_inputs},) ([K])"
        )
    permutation = group_order(name, g_idx, group_size)
    if permutation is None:
        return packed, torch.arange(num_inputs)
    return permute_packed_inputs(packed, num_inputs, permutation), permutation


def per_channel_as_groups(
    scales: torch.Tensor, zeros: torch.Tensor, num_inputs: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A per-channel int4 checkpoint's (group_size -1) scales and zeros [1, N] as ladle's groups
    of 128 [G, N], each group repeating the channel's: the same weights exactly."""
    groups = -(-num_inputs // GROUP_SIZE)
    return scales.expand(groups, -1).contiguous(), zeros.expand(groups, -1).contiguous()
