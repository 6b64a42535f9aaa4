"""`ladle quantize`: stream a float Hugging Face checkpoint, quantize every decoder projection
weight with a GPU method, and write a Hugging Face folder in one of the formats of
quantized_formats.py (safetensors shards + index, config.json with quantization_config, and the
tokenizer and generation files copied unchanged).

Each weight is cast to `dtype` before it is quantized, the same rounding the engine applies when
it loads the float checkpoint in that dtype, so the written folder loads back to exactly the
tensors `--quantization METHOD` computes in memory (tests/model/test_quantized_checkpoints.py).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Collection, Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

from ladle.model.arch_config import MOE_ARCHITECTURES, UnsupportedModelError
from ladle.model.layers.quant import default_float_layers, get_quant_method, in_layers
from ladle.model.layers.quant.float_projections import is_float_projection
from ladle.model.layers.quant.fp8_block import Fp8BlockMethod, blocks_from_group_scales
from ladle.model.layers.quant.int4 import GROUP_SIZE, unpack_int4_rows
from ladle.model.loader import compressed_tensors as ct
from ladle.model.loader.checkpoint_tensors import pack_rows
from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.gguf import iter_gguf_weights
from ladle.model.loader.gguf_source import gguf_hf_config, is_gguf_file, save_gguf_tokenizer
from ladle.model.loader.quantized_formats import (
    AWQ_ORDER,
    DEFAULT_FORMAT,
    FORMAT_METHOD,
    FORMATS,
    LINEAR_WEIGHT,
    SHARD_BYTES,
)
from ladle.model.loader.safetensors import (
    INDEX_FILE,
    find_safetensors_files,
    iter_safetensors_weights,
    read_hf_config,
)


def quantization_config(
    method: str,
    fmt: str,
    symmetric: bool,
    float_modules: list[str] | None = None,
    weight_block_size: int | None = None,
) -> dict:
    """The config.json `quantization_config` a format's readers expect; float_modules (left
    unquantized) as modules_to_not_convert (transformers' and AWQ's key) and, for fp8, also as
    ignored_layers (vLLM's); fp8 `weight_block_size`: square blocks of scales."""
    if fmt == ct.FORMAT:
        return ct.write_config(method, symmetric, list(float_modules or []), weight_block_size)
    config = _method_config(method, fmt, symmetric)
    if weight_block_size is not None:
        config["weight_block_size"] = [weight_block_size, weight_block_size]
    if float_modules:
        config["modules_to_not_convert"] = list(float_modules)
        if fmt == "hf-fp8":
            config["ignored_layers"] = list(float_modules)
    return config


def _method_config(method: str, fmt: str, symmetric: bool) -> dict:
    if fmt == "hf-fp8":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": None}
    if fmt == "gptq":
        return {
            "quant_method": "gptq",
            "bits": 4,
            "group_size": GROUP_SIZE,
            "sym": symmetric,
            "desc_act": False,
            "checkpoint_format": "gptq",
        }
    if fmt == "awq":
        return {
            "quant_method": "awq",
            "bits": 4,
            "group_size": GROUP_SIZE,
            "zero_point": True,
            "version": "gemm",
        }
    return {"quant_method": "ladle", "method": method}


def check_method_format(method: str, fmt: str | None) -> str:
    """The format to write (the method's default when None); ValueError for a bad pair."""
    fmt = fmt or DEFAULT_FORMAT.get(method)
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    wanted = FORMAT_METHOD.get(fmt, method)
    if wanted != method:
        raise ValueError(f"format {fmt!r} holds {wanted} weights, not {method}")
    return fmt


def _format_tensors(
    prefix: str,
    canonical: dict[str, torch.Tensor],
    fmt: str,
    num_inputs: int,
    method: str,
    symmetric: bool,
    weight_block_size: int | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    if weight_block_size is not None:  # fp8 blocks: the scales of each block, once
        block_scale = blocks_from_group_scales(canonical["weight_scale"], weight_block_size)
        scale_name = "weight_scale" if fmt == ct.FORMAT else "weight_scale_inv"
        yield prefix + "weight", canonical["weight"]
        yield prefix + scale_name, block_scale
        return
    if fmt == ct.FORMAT:
        yield from ct.write_tensors(prefix, canonical, method, num_inputs, symmetric)
        return
    if fmt in ("hf-fp8", "ladle"):
        yield prefix + "weight", canonical["weight"]
        yield prefix + "weight_scale", canonical["weight_scale"][:, None].contiguous()
        return
    scales = canonical["weight_scale"].t().contiguous()  # [G, N]
    zeros = canonical["weight_zero"].t().contiguous()  # [G, N]
    if fmt == "gptq":
        yield prefix + "qweight", canonical["weight_packed"].t().contiguous()
        yield prefix + "qzeros", pack_rows(zeros - 1)  # GPTQ v1 stores zero - 1
        yield prefix + "scales", scales
        in_order = (torch.arange(num_inputs) // GROUP_SIZE).to(torch.int32)
        yield prefix + "g_idx", canonical.get("g_idx", in_order)  # act-order's own, if any
        return
    codes = unpack_int4_rows(canonical["weight_packed"], num_inputs)  # [N, K]
    yield prefix + "qweight", pack_rows(codes.t().contiguous(), AWQ_ORDER)
    yield prefix + "qzeros", pack_rows(zeros, AWQ_ORDER)
    yield prefix + "scales", scales


def write_quantized_checkpoint(
    source_dir: str | Path,
    out_dir: str | Path,
    method: str,
    fmt: str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    symmetric: bool = False,
    calibrated: dict[str, dict[str, torch.Tensor]] | None = None,
    float_layers: Collection[int] | None = None,
    float_projections: Collection[str] = (),
    weight_block_size: int | None = None,
) -> dict:
    """Quantize the float checkpoint in `source_dir` (a Hugging Face folder, or a GGUF file
    whose tensors are dequantized) into `out_dir`; returns a summary (quantized tensor count,
    bytes before and after). `calibrated`: canonical tensors already quantized by the
    calibration pass (calibration.py), by checkpoint weight name; other projection weights are
    rounded to nearest here. `float_layers`: decoder layers whose projections are written in
    `dtype` unquantized (default: the method's, quant/__init__.py's KEEP_LAST_LAYERS);
    `float_projections`: projections (q_proj, ...) written unquantized in every layer. Both
    are listed in quantization_config.modules_to_not_convert. `weight_block_size` (fp8): one
    scale per square block of that many rows and inputs (32 to 256, a power of two; 128 is
    DeepSeek's and Qwen3-FP8's), the layout transformers reads as quant_method fp8, instead of
    one per output channel."""
    fmt = check_method_format(method, fmt)
    source_dir, out_dir = Path(source_dir), Path(out_dir)
    if out_dir.resolve() == source_dir.resolve():
        raise ValueError("the output folder must differ from the model folder")
    from_gguf = is_gguf_file(source_dir)
    config = gguf_hf_config(source_dir) if from_gguf else read_hf_config(source_dir)
    if "quantization_config" in config:
        raise ModelLoadError(f"{str(source_dir)!r} is already quantized; give a float checkpoint")
    architecture = (config.get("architectures") or [None])[0]
    if architecture in MOE_ARCHITECTURES:
        # Its experts would be written in a layout ladle cannot load back yet.
        raise UnsupportedModelError(
            f"{str(source_dir)!r} is a {architecture}: ladle quantize does not quantize "
            "mixtures of experts yet (quantized experts: issue 35)"
        )
    if symmetric and method != "int4":
        raise ValueError("--symmetric applies to int4 only (fp8 and int8 are always symmetric)")
    quant_method = get_quant_method(method, symmetric=symmetric)
    if weight_block_size is not None:
        if method != "fp8" or fmt not in ("hf-fp8", ct.FORMAT):
            raise ValueError(
                "--weight-block-size applies to fp8 in the hf-fp8 or compressed-tensors format"
            )
        if calibrated:
            raise ValueError("--weight-block-size is written by round to nearest (--algorithm rtn)")
        quant_method = Fp8BlockMethod(weight_block_size, weight_block_size)
        _check_whole_blocks(config, weight_block_size)
    if float_layers is None:
        float_layers = default_float_layers(method, config.get("num_hidden_layers"))
    float_modules: list[str] = []
    if fmt == ct.FORMAT:
        ct.check_writable(method, config)  # before the folder exists
    out_dir.mkdir(parents=True, exist_ok=True)
    shard: dict[str, torch.Tensor] = {}
    shard_bytes = 0
    weight_map: dict[str, str] = {}
    shard_names: list[list[str]] = []
    summary = {"quantized": 0, "calibrated": 0, "bytes_in": 0, "bytes_out": 0}

    def flush() -> None:
        nonlocal shard, shard_bytes
        if shard:
            name = f"model-{len(shard_names) + 1:05d}.safetensors"
            save_file(shard, str(out_dir / name), metadata={"format": "pt"})
            shard_names.append(list(shard))
            weight_map.update(dict.fromkeys(shard, name))
            shard, shard_bytes = {}, 0

    def add(name: str, tensor: torch.Tensor) -> None:
        nonlocal shard_bytes
        tensor = tensor.contiguous()
        shard[name] = tensor
        shard_bytes += tensor.numel() * tensor.element_size()
        summary["bytes_out"] += tensor.numel() * tensor.element_size()
        if shard_bytes >= SHARD_BYTES:
            flush()

    calibrated = dict(calibrated or {})
    # A rotated model's head (rotation.py) is its own tensor, whether or not the source tied it.
    untie_head = "lm_head.weight" in calibrated
    act_order_written = any("g_idx" in canonical for canonical in calibrated.values())
    if act_order_written and fmt != "gptq":
        raise ValueError(
            f"act-order groups (a g_idx per projection) are written as gptq, not {fmt}"
        )
    if from_gguf:
        weights = iter_gguf_weights(source_dir)
    else:
        weights = iter_safetensors_weights(find_safetensors_files(source_dir))
    for name, tensor in weights:
        summary["bytes_in"] += tensor.numel() * tensor.element_size()
        is_projection = LINEAR_WEIGHT.search(name) and tensor.dim() == 2
        keep_float = in_layers(name, float_layers) or is_float_projection(name, float_projections)
        if is_projection and tensor.is_floating_point() and keep_float:
            float_modules.append(name.removesuffix(".weight"))
            add(name, calibrated.pop(name, {}).get("float", tensor).to(dtype))
        elif is_projection and tensor.is_floating_point():
            canonical = calibrated.pop(name, None)
            if canonical is None:
                canonical = quant_method.quantize(tensor.to(dtype))
            else:
                summary["calibrated"] += 1
            prefix = name[: -len("weight")]
            for out_name, value in _format_tensors(
                prefix, canonical, fmt, tensor.shape[1], method, symmetric, weight_block_size
            ):
                add(out_name, value)
            summary["quantized"] += 1
        else:
            # A norm weight AWQ's folding or a rotation changed (calibration.py) replaces
            # the file's.
            tensor = calibrated.pop(name, {}).get("float", tensor)
            add(name, tensor.to(dtype) if tensor.is_floating_point() else tensor)
    head = calibrated.pop("lm_head.weight", None)
    if head is not None:  # the source had no head tensor: it tied the embedding
        add("lm_head.weight", head["float"].to(dtype))
    if untie_head:
        config["tie_word_embeddings"] = False
    flush()
    if calibrated:
        raise ValueError(f"calibrated weights not in the checkpoint: {sorted(calibrated)[:4]}")
    _rename_single_shard(out_dir, shard_names, weight_map)
    config["quantization_config"] = quantization_config(
        method, fmt, symmetric, float_modules, weight_block_size
    )
    if act_order_written:  # GPTQ's groups formed in act-order: g_idx scatters them
        config["quantization_config"]["desc_act"] = True
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if from_gguf:
        save_gguf_tokenizer(source_dir, out_dir)
    else:
        _copy_side_files(source_dir, out_dir)
    return summary


def _check_whole_blocks(config: dict, block: int) -> None:
    """ValueError (before the folder exists) when a projection's rows or inputs are not whole
    blocks: transformers and vLLM read block-scaled fp8 only then (ladle reads partial ones)."""
    head_dim = config.get("head_dim") or (
        config.get("hidden_size", 0) // max(config.get("num_attention_heads", 1), 1)
    )
    sizes = {
        "hidden_size": config.get("hidden_size"),
        "intermediate_size": config.get("intermediate_size"),
        "num_attention_heads x head_dim": config.get("num_attention_heads", 0) * head_dim,
        "num_key_value_heads x head_dim": config.get("num_key_value_heads", 0) * head_dim,
    }
    for name, size in sizes.items():
        if isinstance(size, int) and size % block:
            raise ValueError(
                f"{name} {size} is not a multiple of --weight-block-size {block}: transformers "
                "and vLLM read fp8 blocks only when every projection is whole blocks (try a "
                "smaller block)"
            )


def _rename_single_shard(out_dir: Path, shard_names: list, weight_map: dict[str, str]) -> None:
    if len(shard_names) == 1:
        (out_dir / "model-00001.safetensors").rename(out_dir / "model.safetensors")
        return
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (out_dir / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def _copy_side_files(source_dir: Path, out_dir: Path) -> None:
    """Tokenizer, chat template and generation config: every small non-weight file."""
    for path in source_dir.iterdir():
        skip = path.suffix == ".safetensors" or path.name in ("config.json", INDEX_FILE)
        if path.is_file() and not skip and path.stat().st_size < 64 << 20:
            shutil.copy2(path, out_dir / path.name)
