"""Act-order int4 folders made as GPTQ makes them (for the CPU and GPU act-order tests): each
input's columns quantized in a random order (shared by the projections of one input, as GPTQ's
Hessian is), groups of 128 formed in that order, the words stored in the original order with
g_idx naming each input's group; GPTQ (desc_act) or compressed-tensors (actorder "group")."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ladle.model.layers.quant.int4 import Int4Method, pack_int4_rows, unpack_int4_rows
from ladle.model.loader.quantized_formats import LINEAR_WEIGHT
from ladle.model.loader.quantized_writer import _format_tensors, quantization_config

# Projections that share an input share GPTQ's column order.
SAME_INPUT = re.compile(r"\.(q_proj|k_proj|v_proj)\.|\.(gate_proj|up_proj)\.")


def _input_key(name: str) -> str:
    return SAME_INPUT.sub(lambda m: ".qkv." if m[1] else ".gate_up.", name)


def write_act_order_folder(
    float_dir: str, out: Path, seed: int = 0, shuffle=None, fmt: str = "gptq"
) -> dict[str, torch.Tensor]:
    """An act-order folder of the float model, GPTQ (desc_act) or compressed-tensors (actorder
    "group", as llm-compressor wrote it before the library dropped that order); returns each
    projection's dequantized weight. `shuffle(name, order)` may change a projection's column
    order (malformed cases)."""
    generator = torch.Generator().manual_seed(seed)
    orders: dict[str, torch.Tensor] = {}
    tensors, dequantized = {}, {}
    method = Int4Method()
    for name, weight in load_file(str(Path(float_dir) / "model.safetensors")).items():
        if not LINEAR_WEIGHT.search(name):
            tensors[name] = weight
            continue
        num_inputs = weight.shape[1]
        key = _input_key(name)
        if key not in orders:
            orders[key] = torch.randperm(num_inputs, generator=generator)
        order = orders[key] if shuffle is None else shuffle(name, orders[key])
        in_order = method.quantize(weight[:, order])  # groups of 128 in GPTQ's order
        codes_in_order = unpack_int4_rows(in_order["weight_packed"], num_inputs)
        codes = torch.empty_like(codes_in_order)
        codes[:, order] = codes_in_order
        canonical = {**in_order, "weight_packed": pack_int4_rows(codes)}
        prefix = name.removesuffix("weight")
        for part, value in _format_tensors(prefix, canonical, fmt, num_inputs, "int4", False):
            tensors[part] = value
        g_idx = torch.empty(num_inputs, dtype=torch.int32)
        g_idx[order] = (torch.arange(num_inputs) // 128).int()
        tensors[prefix + ("g_idx" if fmt == "gptq" else "weight_g_idx")] = g_idx
        weight_in_order = method.dequantize(in_order, num_inputs)
        full = torch.empty_like(weight_in_order)
        full[:, order] = weight_in_order
        dequantized[name.removesuffix(".weight")] = full
    out.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    config = json.loads((Path(float_dir) / "config.json").read_text())
    quantization = quantization_config("int4", fmt, False)
    if fmt == "gptq":
        quantization["desc_act"] = True
    else:
        quantization["config_groups"]["group_0"]["weights"]["actorder"] = "group"
    config["quantization_config"] = quantization
    (out / "config.json").write_text(json.dumps(config))
    for side_file in Path(float_dir).iterdir():
        if side_file.name.startswith("tokenizer"):
            (out / side_file.name).write_bytes(side_file.read_bytes())
    return dequantized
