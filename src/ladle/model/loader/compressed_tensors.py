"""compressed-tensors checkpoints: what llm-compressor writes, and the format of most FP8-dynamic,
W8A8 and W4A16 checkpoints on the Hugging Face Hub that vLLM serves. This module reads their
`quantization_config` into ladle's method, converts their tensors to ladle's canonical ones, and
gives `ladle quantize --format compressed-tensors` the config and tensors to write.

Schemes ladle runs (one scheme for every Linear: `targets: ["Linear"]`):
  fp8   weights float, 8 bits, symmetric, strategy channel, tensor or block (kept exactly and
        run block-scaled, quant/fp8_block.py); formats float-quantized / naive-quantized
  int8  weights int, 8 bits, symmetric, strategy channel or tensor; int-quantized / naive
  int4  weights int, 4 bits, strategy group, group size 128, symmetric or not; pack-quantized
ladle quantizes fp8 and int8 activations per token on the fly whatever the checkpoint says of
them (dynamic per token is what it writes; a static scale or weight-only scheme is run that way
too, and the load says so); int4 is weight-only.

Tensors of one projection, as the compressors store them:
  fp8 / int8  `weight` e4m3 or int8 [N, K]; `weight_scale` [N, 1] (channel), [1] (tensor) or
              [ceil(N/b), ceil(K/b)] (fp8 blocks); `weight_zero_point`, `input_scale`,
              `input_zero_point` may be present and are not used (symmetric zeros are 0)
  int4        `weight_packed` int32 [N, ceil(K/8)]: input k in nibble k % 8 of word k // 8, low
              nibble first, holding q + 8 for the signed code q (ladle's canonical words, bit
              for bit); `weight_scale` [N, G]; `weight_shape` [N, K]; asymmetric also
              `weight_zero_point` int32 [ceil(N/8), G]: zero point + 8, eight output rows a
              word (packed along the rows); `weight_g_idx` [K]: k // 128, or with
              `actorder: "group"` any order of groups of 128 (quant/act_order.py)
so W = (code - (zero point + 8)) * scale: ladle's zero is the stored nibble itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import torch

from ladle.model.layers.quant.act_order import PERMUTATION
from ladle.model.layers.quant.fp8 import FP8_DTYPE
from ladle.model.layers.quant.int4 import GROUP_SIZE, GROUP_SIZES, num_groups
from ladle.model.loader.checkpoint_tensors import (
    PER_CHANNEL,
    fp8_canonical,
    int4_input_order,
    pack_rows,
    per_channel_as_groups,
    per_row_scale,
    unpack_rows,
)
from ladle.model.loader.errors import ModelLoadError

QUANT_METHOD = "compressed-tensors"
FORMAT = "compressed-tensors"
# The compressor format each ladle method is written in.
WRITE_FORMAT = {"fp8": "float-quantized", "int8": "int-quantized", "int4": "pack-quantized"}
READ_FORMATS = {
    "fp8": ("float-quantized", "naive-quantized"),
    "int8": ("int-quantized", "naive-quantized"),
    "int4": ("pack-quantized",),
}
# Parts a projection may carry that ladle does not use.
UNUSED_PARTS = ("weight_zero_point", "input_scale", "input_zero_point", "weight_g_idx")


def read_scheme(qc: dict, where: str) -> tuple[str, bool, str | None]:
    """(ladle method, symmetric, a note to print at load or None) of a compressed-tensors
    quantization_config; ModelLoadError naming the field ladle cannot run."""
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise ModelLoadError(f"{where!r}: compressed-tensors config_groups is missing or empty")
    schemes = list(groups.values())
    first = schemes[0]
    if any(_without_targets(scheme) != _without_targets(first) for scheme in schemes[1:]):
        raise ModelLoadError(
            f"{where!r}: compressed-tensors config_groups hold different schemes "
            f"({', '.join(groups)}); ladle runs one scheme for every projection"
        )
    weights = first.get("weights") if isinstance(first, dict) else None
    if not isinstance(weights, dict):
        raise ModelLoadError(f"{where!r}: compressed-tensors scheme has no weights quantization")
    kind, bits = str(weights.get("type", "int")).lower(), weights.get("num_bits")
    strategy = str(weights.get("strategy") or "tensor").lower()
    symmetric = bool(weights.get("symmetric", True))
    activations = first.get("input_activations")

    def bad(field: str, value, expected: str) -> ModelLoadError:
        return ModelLoadError(
            f"{where!r}: compressed-tensors {field}={value!r} is not supported (ladle runs "
            f"{expected})"
        )

    if kind == "float" and bits == 8:
        method = "fp8"
        if strategy not in ("channel", "tensor", "block"):
            raise bad("weights.strategy", strategy, "channel, tensor or block fp8 weights")
    elif kind == "int" and bits == 8:
        method = "int8"
        if strategy not in ("channel", "tensor"):
            raise bad("weights.strategy", strategy, "channel or tensor int8 weights")
    elif kind == "int" and bits == 4:
        method = "int4"
        is_group = strategy == "group" and weights.get("group_size") in GROUP_SIZES
        if not (is_group or strategy == "channel"):
            raise bad(
                "weights.strategy/group_size",
                (strategy, weights.get("group_size")),
                f"4-bit weights per channel or in groups of {', '.join(map(str, GROUP_SIZES))}",
            )
        if activations is not None:
            raise bad("input_activations", activations, "4-bit weights with float activations")
    else:
        raise bad("weights type/num_bits", (kind, bits), "float 8, int 8 or int 4 weights")
    if method != "int4" and not symmetric:
        raise bad("weights.symmetric", False, f"symmetric {method} weights")
    fmt = first.get("format") or qc.get("format")
    if fmt not in READ_FORMATS[method]:
        raise bad("format", fmt, f"{method} as {' or '.join(READ_FORMATS[method])}")
    block = weights.get("block_structure") if strategy == "block" else None
    block_columns = block[-1] if isinstance(block, list) and block else None
    return method, symmetric, _activation_note(method, activations, block_columns)


def int4_group_size(qc: dict) -> int:
    """The int4 scheme's group size, -1 for per-channel weights (read_scheme has checked it)."""
    weights = next(iter(qc["config_groups"].values()))["weights"]
    if str(weights.get("strategy") or "").lower() == "channel":
        return PER_CHANNEL
    return int(weights["group_size"])


def act_order(qc: dict) -> bool:
    """Whether the scheme's int4 groups follow an activation order (`actorder: "group"`: each
    projection's weight_g_idx scatters them; quant/act_order.py). "weight" order keeps the
    groups in place."""
    weights = next(iter(qc["config_groups"].values()))["weights"]
    return str(weights.get("actorder") or "").lower() == "group"


def block_structure(qc: dict, where: str) -> list | None:
    """The fp8 weight block [rows, inputs] of a scheme with the `block` strategy, else None
    (read_scheme has checked the rest of the scheme)."""
    weights = next(iter(qc["config_groups"].values()))["weights"]
    if str(weights.get("strategy") or "").lower() != "block":
        return None
    if weights.get("block_structure") is None:
        raise ModelLoadError(f"{where!r}: compressed-tensors block strategy has no block_structure")
    return weights["block_structure"]


def _without_targets(scheme) -> dict:
    return {k: v for k, v in scheme.items() if k != "targets"} if isinstance(scheme, dict) else {}


def _activation_note(method: str, activations, block_columns: int | None) -> str | None:
    """What ladle does differently from the checkpoint's activation scheme, if anything: it
    quantizes activations on the fly per token, or with block weights per token and group of
    the block's width."""
    if method == "int4":
        return None
    blocks = block_columns is not None
    ladle_runs = f"per token and group of {block_columns} inputs" if blocks else "per token"
    if isinstance(activations, dict):
        dynamic = activations.get("dynamic") in (True, "true", "True")
        strategy = str(activations.get("strategy") or "tensor").lower()
        group_size = activations.get("group_size")
        if dynamic and (strategy == "token" if not blocks else group_size == block_columns):
            return None
        described = f"{'dynamic' if dynamic else 'static'} per-{strategy}"
        if strategy == "group":
            described += f" ({group_size})"
    else:
        described = "none (weight-only)"
    return (
        f"the checkpoint's {method} activation quantization is {described}; ladle quantizes "
        f"activations {ladle_runs} on the fly"
    )


def split_ignore(qc: dict, where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The `ignore` list as (module names, 're:' patterns without the prefix)."""
    ignore = qc.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(name, str) for name in ignore):
        raise ModelLoadError(f"{where!r}: compressed-tensors ignore is not a list of names")
    names = tuple(name for name in ignore if not name.startswith("re:"))
    patterns = tuple(name[3:] for name in ignore if name.startswith("re:"))
    return names, patterns


def matching_modules(patterns: tuple[str, ...], module_names: set[str]) -> tuple[str, ...]:
    """The module names an ignore list's patterns match (re.match, as compressed-tensors
    applies them)."""
    compiled = [re.compile(pattern) for pattern in patterns]
    return tuple(sorted(n for n in module_names if any(p.match(n) for p in compiled)))


def required_parts(
    method: str, symmetric: bool, act_order: bool = False
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(parts every quantized projection needs, optional ones)."""
    if method == "int4":
        required = ("weight_packed", "weight_scale", "weight_shape")
        if not symmetric:
            required += ("weight_zero_point",)
        if act_order:
            return required + ("weight_g_idx",), ()
        return required, ("weight_g_idx",)
    return ("weight", "weight_scale"), UNUSED_PARTS


def canonical(prefix: str, parts: dict[str, torch.Tensor], fmt) -> dict[str, torch.Tensor]:
    """ladle's canonical tensors of one projection's compressed-tensors parts (prefix ends
    with '.'); fmt is the checkpoint's CheckpointQuantization."""
    method, block_size = fmt.method, fmt.block_size
    if method == "int4":
        return _int4_canonical(prefix, parts, fmt.symmetric, fmt.act_order, fmt.group_size)
    weight, scale = parts["weight"], parts["weight_scale"]
    code_dtype = FP8_DTYPE if method == "fp8" else torch.int8
    if weight.dtype != code_dtype or weight.dim() != 2:
        raise ModelLoadError(
            f"tensor {prefix + 'weight'!r} is {weight.dtype} {tuple(weight.shape)}; a {method} "
            f"checkpoint stores {code_dtype} [N, K]"
        )
    zero = parts.get("weight_zero_point")
    if zero is not None and bool(zero.ne(0).any()):
        raise ModelLoadError(f"tensor {prefix + 'weight_zero_point'!r} is not zero (asymmetric)")
    if method == "fp8":
        return fp8_canonical(prefix, {"weight": weight, "weight_scale": scale}, block_size)
    return {
        "weight": weight,
        "weight_scale": per_row_scale(prefix + "weight_scale", scale, weight.shape),
    }


def _int4_canonical(
    prefix: str,
    parts: dict[str, torch.Tensor],
    symmetric: bool,
    act_order: bool,
    group_size: int,
) -> dict[str, torch.Tensor]:
    packed, scale, shape = parts["weight_packed"], parts["weight_scale"], parts["weight_shape"]
    if shape.numel() != 2:
        raise ModelLoadError(f"tensor {prefix + 'weight_shape'!r} does not hold [N, K]")
    rows, cols = (int(value) for value in shape.tolist())
    per_channel = group_size == PER_CHANNEL
    groups = 1 if per_channel else num_groups(cols, group_size)
    _expect(prefix + "weight_packed", packed, (rows, -(-cols // 8)), torch.int32)
    if tuple(scale.shape) != (rows, groups):
        grouping = "one group per channel" if per_channel else f"groups of {group_size}"
        raise ModelLoadError(
            f"tensor {prefix + 'weight_scale'!r} has shape {tuple(scale.shape)}; expected "
            f"({rows}, {groups}): {cols} inputs in {grouping}"
        )
    scale16 = scale.to(torch.float16)
    if not torch.equal(scale16.float(), scale.float()):
        raise ModelLoadError(
            f"tensor {prefix + 'weight_scale'!r} holds scales float16 cannot hold exactly"
        )
    if symmetric:
        zero = torch.full((rows, groups), 8, dtype=torch.uint8)
    else:
        words = parts["weight_zero_point"]
        _expect(prefix + "weight_zero_point", words, (-(-rows // 8), groups), torch.int32)
        zero = unpack_rows(words.t().contiguous(), rows).t().contiguous()
    if per_channel:  # ladle's groups of 128, each repeating the channel's scale and zero
        scale16, zero = (t.t() for t in per_channel_as_groups(scale16.t(), zero.t(), cols))
        scale16, zero = scale16.contiguous(), zero.contiguous()
    packed, permutation = int4_input_order(
        prefix + "weight_g_idx",
        parts.get("weight_g_idx"),
        packed.contiguous(),
        cols,
        group_size,
        act_order,
    )
    canonical = {"weight_packed": packed, "weight_scale": scale16, "weight_zero": zero}
    return canonical if permutation is None else {**canonical, PERMUTATION: permutation}


def _expect(name: str, tensor: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    if tuple(tensor.shape) != shape or tensor.dtype != dtype:
        raise ModelLoadError(
            f"tensor {name!r} is {tensor.dtype} {tuple(tensor.shape)}; expected {dtype} {shape}"
        )


# ----------------------------------------------------------------------------- writing


def write_config(
    method: str, symmetric: bool, float_modules: list[str], weight_block_size: int | None = None
) -> dict:
    """The quantization_config of a folder `ladle quantize --format compressed-tensors` writes:
    dynamic per-token activations for fp8 and int8, per-channel weights; int4 weight-only in
    groups of 128; fp8 with `weight_block_size` square weight blocks and dynamic activations per
    group of the block's width (llm-compressor's FP8_BLOCK). The LM head and `float_modules` are in
    `ignore`."""
    fmt = WRITE_FORMAT[method]
    if method == "int4":
        weights = _args(4, "int", symmetric, "group", group_size=GROUP_SIZE)
        activations = None
    elif weight_block_size is not None:
        weights = _args(8, "float", True, "block")
        weights["block_structure"] = [weight_block_size, weight_block_size]
        activations = _args(8, "float", True, "group", group_size=weight_block_size, dynamic=True)
    else:
        kind = "float" if method == "fp8" else "int"
        weights = _args(8, kind, True, "channel")
        activations = _args(8, kind, True, "token", dynamic=True)
    scheme = {
        "targets": ["Linear"],
        "weights": weights,
        "input_activations": activations,
        "output_activations": None,
        "format": fmt,
    }
    return {
        "quant_method": QUANT_METHOD,
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": scheme},
        "ignore": ["lm_head", *float_modules],
        "kv_cache_scheme": None,
    }


def check_writable(method: str, config: dict) -> None:
    """ValueError when the model's projections cannot be written as compressed-tensors `method`:
    int4 needs every projection's inputs a multiple of the group (hidden size, intermediate
    size, attention heads x head dim), which config.json gives before any tensor is read."""
    if method != "int4":
        return
    hidden = config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // config.get("num_attention_heads", 1))
    inputs = {
        "hidden_size": hidden,
        "intermediate_size": config.get("intermediate_size"),
        "num_attention_heads x head_dim": config.get("num_attention_heads", 0) * head_dim,
    }
    for name, size in inputs.items():
        if isinstance(size, int) and size % GROUP_SIZE:
            raise ValueError(
                f"{name} {size} is not a multiple of {GROUP_SIZE}: compressed-tensors int4 "
                f"needs whole groups of {GROUP_SIZE} inputs in every projection (use --format "
                "gptq or awq)"
            )


def _args(
    bits: int,
    kind: str,
    symmetric: bool,
    strategy: str,
    group_size: int | None = None,
    dynamic: bool = False,
) -> dict:
    return {
        "num_bits": bits,
        "type": kind,
        "symmetric": symmetric,
        "strategy": strategy,
        "group_size": group_size,
        "block_structure": None,
        "dynamic": dynamic,
        "actorder": None,
        "observer": None if dynamic else "minmax",
        "observer_kwargs": {},
    }


def write_tensors(
    prefix: str,
    canonical_tensors: dict[str, torch.Tensor],
    method: str,
    num_inputs: int,
    symmetric: bool,
) -> Iterator[tuple[str, torch.Tensor]]:
    """One projection's tensors as the compressed-tensors compressors store them (prefix ends
    with '.')."""
    if method != "int4":
        yield prefix + "weight", canonical_tensors["weight"]
        yield prefix + "weight_scale", canonical_tensors["weight_scale"][:, None].contiguous()
        return
    if num_inputs % GROUP_SIZE:
        # compressed-tensors (and vLLM's kernels for it) need whole groups; ladle's own int4
        # formats hold a partial last group.
        raise ValueError(
            f"{prefix}weight has {num_inputs} inputs, not a multiple of {GROUP_SIZE}: "
            "compressed-tensors int4 needs whole groups (use --format gptq or awq)"
        )
    packed = canonical_tensors["weight_packed"]
    zero = canonical_tensors["weight_zero"]  # [N, G], the stored nibble: zero point + 8
    rows = packed.shape[0]
    yield prefix + "weight_packed", packed
    yield prefix + "weight_scale", canonical_tensors["weight_scale"]
    yield prefix + "weight_shape", torch.tensor([rows, num_inputs], dtype=torch.int64)
    if not symmetric:
        yield prefix + "weight_zero_point", pack_rows(zero.t().contiguous()).t().contiguous()
