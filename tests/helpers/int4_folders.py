"""int4 folders written as GPTQ, AutoAWQ and llm-compressor write them, in any of their group
sizes, with or without act-order (for the CPU and GPU tests of what ladle loads): with
act-order each input's columns are quantized in a random order (shared by the projections of
one input, as GPTQ's Hessian is), groups formed in that order, the words stored in the
original order with g_idx naming each input's group."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ladle.model.layers.quant.int4 import (
    dequantize_int4_groups,
    pack_int4_rows,
    quantize_int4_groups,
)
from ladle.model.loader.quantized_formats import LINEAR_WEIGHT
from ladle.model.loader.quantized_writer import _format_tensors, quantization_config

# Projections that share an input share GPTQ's column order.
SAME_INPUT = re.compile(r"\.(q_proj|k_proj|v_proj)\.|\.(gate_proj|up_proj)\.")


def _input_key(name: str) -> str:
    return SAME_INPUT.sub(lambda m: ".qkv." if m[1] else ".gate_up.", name)


def write_int4_folder(
    float_dir: str,
    out: Path,
    fmt: str = "gptq",
    group_size: int = 128,
    act_order: bool = False,
    seed: int = 0,
    shuffle=None,
) -> dict[str, torch.Tensor]:
    """An int4 folder of the float model, written here (not by ladle's writer), GPTQ, AWQ or
    compressed-tensors, in groups of `group_size` (-1: one group per output channel); with
    `act_order` each input's columns are quantized in a random order shared by the projections
    of that input, the groups formed in that order (GPTQ desc_act, compressed-tensors actorder
    "group", as llm-compressor wrote it before its library dropped that order). Returns each
    projection's dequantized weight. `shuffle(name, order)` may change a projection's column
    order (malformed cases)."""
    generator = torch.Generator().manual_seed(seed)
    orders: dict[str, torch.Tensor] = {}
    tensors, dequantized = {}, {}
    for name, weight in load_file(str(Path(float_dir) / "model.safetensors")).items():
        if not LINEAR_WEIGHT.search(name):
            tensors[name] = weight
            continue
        num_inputs = weight.shape[1]
        group = num_inputs if group_size == -1 else group_size
        key = _input_key(name)
        if key not in orders:
            orders[key] = (
                torch.randperm(num_inputs, generator=generator)
                if act_order
                else torch.arange(num_inputs)
            )
        order = orders[key] if shuffle is None else shuffle(name, orders[key])
        codes_in_order, scale, zero = quantize_int4_groups(weight[:, order], group)
        codes = torch.empty_like(codes_in_order)
        codes[:, order] = codes_in_order
        canonical = {
            "weight_packed": pack_int4_rows(codes),
            "weight_scale": scale,
            "weight_zero": zero,
        }
        prefix = name.removesuffix("weight")
        for part, value in _format_tensors(prefix, canonical, fmt, num_inputs, "int4", False):
            tensors[part] = value
        g_idx = torch.empty(num_inputs, dtype=torch.int32)
        g_idx[order] = (torch.arange(num_inputs) // group).int()
        if fmt == "gptq":
            tensors[prefix + "g_idx"] = g_idx
        elif fmt == "compressed-tensors" and act_order:
            tensors[prefix + "weight_g_idx"] = g_idx
        weight_in_order = dequantize_int4_groups(codes_in_order, scale, zero, group)
        full = torch.empty_like(weight_in_order)
        full[:, order] = weight_in_order
        dequantized[name.removesuffix(".weight")] = full
    out.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    config = json.loads((Path(float_dir) / "config.json").read_text())
    quantization = quantization_config("int4", fmt, False)
    if fmt == "compressed-tensors":
        weights = quantization["config_groups"]["group_0"]["weights"]
        if group_size == -1:
            weights.update(strategy="channel", group_size=None)
        else:
            weights["group_size"] = group_size
        if act_order:
            weights["actorder"] = "group"
    else:
        quantization["group_size"] = group_size
        if act_order:
            quantization["desc_act"] = True
    config["quantization_config"] = quantization
    (out / "config.json").write_text(json.dumps(config))
    for side_file in Path(float_dir).iterdir():
        if side_file.name.startswith("tokenizer"):
            (out / side_file.name).write_bytes(side_file.read_bytes())
    return dequantized


def write_act_order_folder(
    float_dir: str, out: Path, seed: int = 0, shuffle=None, fmt: str = "gptq"
) -> dict[str, torch.Tensor]:
    """write_int4_folder in groups of 128 with act_order."""
    return write_int4_folder(float_dir, out, fmt, act_order=True, seed=seed, shuffle=shuffle)
