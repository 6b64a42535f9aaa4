"""Model loading: find the weights a ModelConfig names, build the model on the meta device,
materialise it once on the target device and dtype, and stream the weights in.

    load_model(model_config, device, dtype, attention_backend) -> LoadedModel

Sources, chosen from load_format and the model string:
  dummy        a preset name (presets.py) or a local HF folder's config.json; random weights
  gguf         a path ending in .gguf (or load_format='gguf')
  safetensors  a local HF folder (config.json + *.safetensors, sharded or not), or a Hugging
               Face Hub id, taken from the cache or downloaded (hub.py)
Every failure is a ModelLoadError (a ValueError) that names the path and the problem.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from ladle.attention.base import AttentionBackend
from ladle.config import CHECKPOINT_QUANTIZATIONS, ModelConfig
from ladle.distributed.pipeline import SINGLE_STAGE, PipelineStage
from ladle.distributed.tensor_parallel import SINGLE, TensorParallel
from ladle.kernels.cpu_native.build import native_library
from ladle.model.arch_config import MOE_ARCHITECTURES, ModelArchConfig, UnsupportedModelError
from ladle.model.layers.moe_fp8 import (
    dequantize_experts_,
    has_experts,
    prepare_experts_for_fp8_checkpoint_,
    quantize_experts_fp8_,
)
from ladle.model.layers.quant import (
    QUANT_METHODS,
    finalize_linears_,
    prepare_linears_for_checkpoint_,
    quantize_linears_,
)
from ladle.model.layers.quant.act_order import (
    add_input_permutations_,
    drop_identity_permutations_,
    fold_down_permutations_,
)
from ladle.model.layers.quantize_pass import quantize_model_
from ladle.model.layers.quantized_linear import adopt_native_weights_
from ladle.model.loader.dummy import fill_dummy_weights
from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.hub import looks_like_hub_id, resolve_hub_model
from ladle.model.loader.presets import PRESETS, get_preset
from ladle.model.loader.progress import with_progress
from ladle.model.loader.quantized_formats import (
    CheckpointQuantization,
    convert_quantized_weights,
    read_checkpoint_quantization,
    with_matched_float_modules,
)
from ladle.model.loader.safetensors import (
    check_safetensors_files,
    find_safetensors_files,
    iter_safetensors_weights,
    read_hf_config,
    safetensors_tensor_names,
)
from ladle.model.loader.safetensors_direct import iter_safetensors_on_device
from ladle.model.models.llama import to_checkpoint_name, to_param_name
from ladle.model.models.registry import get_model_class

__all__ = ["LoadedModel", "ModelLoadError", "build_model", "load_model"]

ModelSource = Literal["safetensors", "gguf", "dummy"]
# Given the built model (its weights not yet filled) and its config: a context the weights fill
# inside (load_model's while_loading).
WhileLoading = Callable[[nn.Module, ModelArchConfig], contextlib.AbstractContextManager]


@dataclass
class LoadedModel:
    """A model ready to run, and where it came from."""

    model: nn.Module
    arch_config: ModelArchConfig
    model_path: str | None  # folder or .gguf file; None for a dummy preset
    source: ModelSource
    # The method a pre-quantized checkpoint was loaded with (quantized_formats.py), else None.
    checkpoint_quantization: str | None = None


def load_model(
    model_config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    attention_backend: AttentionBackend,
    tp: TensorParallel = SINGLE,
    stage: PipelineStage = SINGLE_STAGE,
    while_loading: WhileLoading | None = None,
) -> LoadedModel:
    """Load the model `model_config` names onto `device` in `dtype`, in eval mode, then quantize
    its weights when model_config.quantization asks for it (see resolve_quantization). With
    tensor parallelism (tp) the model holds, and loads, only this rank's slices; on a pipeline
    stage, only that stage's layers.

    while_loading(model, arch_config): a context manager the weights are filled inside, given
    the built model before they are; called only where the modules it sees are final (dummy
    weights or a float safetensors folder, no quantization after), so work that needs the
    model's shapes and not its values (start-up's Triton build pass) can run beside the load."""
    loaded = _load_unquantized(
        model_config, device, dtype, attention_backend, tp, stage, while_loading
    )
    if loaded.checkpoint_quantization is not None:
        return loaded
    method = resolve_quantization(model_config, loaded.source, device)
    if method is not None and device.type == "cuda":
        quantize_linears_(loaded.model, method)
        if method == "fp8" and has_experts(loaded.model):
            quantize_experts_fp8_(loaded.model)  # per channel, as the dense fp8 layers
        return loaded
    if method == "gguf":
        kept, dequantized = adopt_native_weights_(loaded.model)
        print(
            f"[ladle] GGUF tensors kept in their own format: {len(kept)} (Q8_0/Q4_0/Q4_1/Q4_K/"
            f"Q6_K); quantized to int8 from float: {len(dequantized)} mixed-layout layers and "
            "every other linear weight",
            flush=True,
        )
        method = "int8"
    if method is not None:
        # auto and gguf put what they do not keep in weight-only int8 (+0.6% perplexity); an
        # explicit int8 runs int8 x int8, faster and coarser (docs/quantization.md).
        weight_only = model_config.quantization in ("auto", "gguf")
        quantize_model_(loaded.model, method, weight_only=weight_only)
    return loaded


def resolve_quantization(
    model_config: ModelConfig, source: ModelSource, device: torch.device
) -> str | None:
    """The quantization to apply, or None. 'gguf' keeps a GGUF file's Q8_0/Q4_0/Q4_1/Q4_K/Q6_K
    tensors in their own format (and the rest in weight-only int8). 'auto' keeps a GGUF
    checkpoint quantized on the CPU unless the user chose a dtype: as 'gguf' where ladle's C
    kernels are built (its 4-bit layers then multiply 16-bit quantized activations with integer
    dot products: faster than int8 weight-only at every batch size measured, and closer to the
    float32 model), else in weight-only int8 (without the C kernels torch would dequantize the
    4-bit blocks every step). docs/quantization.md, "int4 x int8 dot products"."""
    method = model_config.quantization
    if method == "auto":
        is_default_dtype = model_config.dtype == "auto"
        keep_quantized = source == "gguf" and device.type == "cpu" and is_default_dtype
        if not keep_quantized:
            return None
        return "gguf" if native_library() is not None else "int8"
    if method == "none":
        return None
    if device.type == "cuda" and method not in QUANT_METHODS:
        raise ValueError(f"quantization {method!r} is not available on CUDA; use {QUANT_METHODS}")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(
            f"quantization {method!r} runs on the CPU only, or on CUDA for {QUANT_METHODS}"
        )
    if method == "gguf" and source != "gguf":
        raise ValueError("quantization 'gguf' keeps a GGUF file's tensors; the model is not one")
    return method


def _load_unquantized(
    model_config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype,
    attention_backend: AttentionBackend,
    tp: TensorParallel,
    stage: PipelineStage,
    while_loading: WhileLoading | None = None,
) -> LoadedModel:
    name = model_config.model
    num_ranks = tp.size * stage.size
    load_format = model_config.load_format
    overrides = dict(model_config.hf_overrides or {})
    if load_format == "dummy":
        _refuse_checkpoint_format_names(model_config, f"dummy {name}")
        arch_config, model_path = _dummy_arch_config(name, overrides)
        _check_max_model_len(arch_config, model_config, model_path or name)
        model = build_model(arch_config, device, dtype, attention_backend, tp, stage)
        with _beside_weights(while_loading, model_config, "dummy", device, model, arch_config):
            fill_dummy_weights(model, model_config.seed)
        return LoadedModel(model, arch_config, model_path, "dummy")
    if name is None:
        raise ModelLoadError(
            "no model given: pass a Hugging Face folder, a .gguf file, or a preset name with "
            "load_format='dummy'"
        )
    path = Path(name).expanduser()
    if load_format == "gguf" or (load_format == "auto" and name.lower().endswith(".gguf")):
        _refuse_checkpoint_format_names(model_config, str(path))
        if num_ranks > 1:
            raise ModelLoadError(
                f"{str(path)!r}: GGUF files run on one rank; {num_ranks} ranks (tensor or "
                "pipeline parallelism) load Hugging Face safetensors folders (or dummy weights)"
            )
        return _load_gguf(path, model_config, overrides, device, dtype, attention_backend)
    model_dir = _resolve_model_dir(name, path, model_config)
    config = read_hf_config(model_dir, overrides)
    arch_config = _parse_arch_config(config, model_dir)
    _check_max_model_len(arch_config, model_config, str(model_dir))
    files = find_safetensors_files(model_dir)
    check_safetensors_files(files)
    checkpoint_quant = read_checkpoint_quantization(config, str(model_dir))
    model = build_model(arch_config, device, dtype, attention_backend, tp, stage)
    tensor_names = safetensors_tensor_names(files)
    # A pipeline stage, or an expert-parallel rank, reads only its own tensors.
    wanted = getattr(model, "holds", None) if num_ranks > 1 else None
    weights = with_progress(
        _safetensors_reader(files, wanted, device, tp, float_checkpoint=checkpoint_quant is None),
        sum(1 for name in tensor_names if wanted is None or wanted(name)),
        "Loading safetensors",
    )
    if checkpoint_quant is None:
        _refuse_checkpoint_format_names(model_config, str(model_dir))
        source = "safetensors"
        with _beside_weights(while_loading, model_config, source, device, model, arch_config):
            _load_weights(model, weights, str(model_dir))
        return LoadedModel(model, arch_config, str(model_dir), source)
    _check_checkpoint_method(model_config, checkpoint_quant, str(model_dir))
    is_moe = arch_config.architecture in MOE_ARCHITECTURES
    if is_moe and checkpoint_quant.method != "fp8":
        raise UnsupportedModelError(
            f"{str(model_dir)!r} is a {checkpoint_quant.method}-quantized "
            f"{arch_config.architecture}; ladle loads mixtures of experts from float and fp8 "
            "checkpoints only"
        )
    checkpoint_quant = with_matched_float_modules(checkpoint_quant, tensor_names)
    if checkpoint_quant.note:
        print(f"[ladle] {model_dir}: {checkpoint_quant.note}", flush=True)
    float_modules = _float_module_names(model, checkpoint_quant.float_modules, str(model_dir))
    prepare_linears_for_checkpoint_(model, checkpoint_quant.quant_method(), float_modules)
    if is_moe:
        prepare_experts_for_fp8_checkpoint_(model, checkpoint_quant.block_size)
    if checkpoint_quant.act_order:
        add_input_permutations_(model)
    _load_weights(model, convert_quantized_weights(weights, checkpoint_quant), str(model_dir))
    if checkpoint_quant.act_order:
        drop_identity_permutations_(model)
        fold_down_permutations_(model)
    finalize_linears_(model)
    if is_moe and device.type != "cuda":
        dequantize_experts_(model, dtype)  # the CPU's torch path runs float experts
    if checkpoint_quant.method == "fp8" and device.type != "cuda":
        print(
            "[ladle] fp8 checkpoint on the CPU: its e4m3 weights are dequantized to float32 at "
            "load (the CPU has no fp8 matmul); activations are still quantized on the fly as on "
            "the GPU",
            flush=True,
        )
    return LoadedModel(model, arch_config, str(model_dir), "safetensors", checkpoint_quant.method)


def _beside_weights(
    while_loading: WhileLoading | None,
    model_config: ModelConfig,
    source: ModelSource,
    device: torch.device,
    model: nn.Module,
    arch_config: ModelArchConfig,
) -> contextlib.AbstractContextManager:
    """while_loading's context where no quantization will change the modules after the load."""
    if while_loading is None or resolve_quantization(model_config, source, device) is not None:
        return contextlib.nullcontext()
    return while_loading(model, arch_config)


def _safetensors_reader(
    files: list[Path],
    wanted: Callable[[str], bool] | None,
    device: torch.device,
    tp: TensorParallel,
    float_checkpoint: bool,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Float checkpoints on one CUDA rank are read straight onto the GPU (safetensors_direct.py:
    reader threads, pinned pieces, copies that do not block). Tensor-parallel ranks keep the
    memory-mapped reader, through which each reads only the rows it holds; quantized formats
    keep it too (their conversions run on host tensors). LADLE_DIRECT_SAFETENSORS=0 turns the
    direct reader off."""
    direct = (
        float_checkpoint
        and device.type == "cuda"
        and tp.size == 1
        and os.environ.get("LADLE_DIRECT_SAFETENSORS", "1") != "0"
    )
    if not direct:
        return iter_safetensors_weights(files, wanted)
    return iter_safetensors_on_device(
        files, device, wanted, fallback=lambda file: iter_safetensors_weights([file], wanted)
    )


def _float_module_names(model: nn.Module, checkpoint_modules: tuple[str, ...], where: str) -> set:
    """ladle's Linear modules for a checkpoint's modules_to_not_convert: merged modules (q/k/v,
    gate/up) must be listed whole, since one matmul cannot be half float."""
    listed = set(checkpoint_modules)
    names = set()
    for checkpoint_module in checkpoint_modules:
        param_name, _ = to_param_name(checkpoint_module + ".weight")
        module_name = param_name.removesuffix(".weight")
        try:
            module = model.get_submodule(module_name)
        except AttributeError:
            continue  # not a ladle Linear (an lm_head the model ties, say): nothing to keep
        shards = getattr(module, "output_sizes", None)
        shard_ids = {"q", "k", "v"} if hasattr(module, "q_size") else range(len(shards or []))
        for shard in shard_ids if shards else ():
            sibling = to_checkpoint_name(param_name, shard).removesuffix(".weight")
            if sibling not in listed:
                raise ModelLoadError(
                    f"{where!r}: modules_to_not_convert lists {checkpoint_module!r} but not "
                    f"{sibling!r}, which ladle runs in the same matmul ({module_name})"
                )
        names.add(module_name)
    return names


def _refuse_checkpoint_format_names(model_config: ModelConfig, where: str) -> None:
    """ModelLoadError for vLLM's checkpoint-format names (--quantization gptq, awq, ...) on a
    model that is not such a checkpoint: they load one, they do not quantize."""
    wanted = model_config.quantization
    if wanted in CHECKPOINT_QUANTIZATIONS:
        raise ModelLoadError(
            f"--quantization {wanted} loads a {CHECKPOINT_QUANTIZATIONS[wanted]} checkpoint, and "
            f"{where!r} is not one; to quantize it at load use --quantization int4, int8 or fp8"
        )


def _check_checkpoint_method(
    model_config: ModelConfig, checkpoint_quant: CheckpointQuantization, where: str
) -> None:
    """ModelLoadError when --quantization asks for something else than the checkpoint holds:
    another method, or (vLLM's format names) another format."""
    wanted, method = model_config.quantization, checkpoint_quant.method
    if wanted in CHECKPOINT_QUANTIZATIONS:
        expected = CHECKPOINT_QUANTIZATIONS[wanted]
        if checkpoint_quant.format != expected:
            raise ModelLoadError(
                f"{where!r} is a {checkpoint_quant.format} checkpoint ({method}); --quantization "
                f"{wanted} loads {expected} ones (use auto to load any)"
            )
        return
    if wanted not in ("auto", method):
        raise ModelLoadError(
            f"{where!r} holds {method}-quantized weights; --quantization {wanted} cannot change "
            f"that (use auto or {method}, or load the float checkpoint)"
        )


def build_model(
    arch_config: ModelArchConfig,
    device: torch.device,
    dtype: torch.dtype,
    attention_backend: AttentionBackend,
    tp: TensorParallel = SINGLE,
    stage: PipelineStage = SINGLE_STAGE,
) -> nn.Module:
    """Build the model's modules on the meta device (no memory, no init), then allocate its
    parameters once, uninitialised, on `device` in `dtype`; the caller fills them."""
    model_class = get_model_class(arch_config.architecture)
    with torch.device("meta"):
        model = model_class(arch_config, attention_backend, tp, stage)
    # Module.to_empty's empty_like on meta tensors goes through torch's Python reference
    # implementation, whose first use imports sympy (~1 s of start-up); plain empty does not.
    # Floating tensors take the model's dtype, as Module.to(dtype) would; others keep theirs.
    model = model._apply(
        lambda meta: torch.empty(
            meta.shape, dtype=dtype if meta.is_floating_point() else meta.dtype, device=device
        )
    )
    # Buffers that are computed rather than loaded (the rotary table) are filled here.
    for module in model.modules():
        init_buffers = getattr(module, "init_buffers", None)
        if callable(init_buffers):
            init_buffers()
    return model.eval()


def _resolve_model_dir(name: str, path: Path, model_config: ModelConfig) -> Path:
    if path.is_dir():
        return path
    if path.exists():
        raise ModelLoadError(
            f"model {name!r} is a file; expected a Hugging Face folder or a .gguf file"
        )
    if looks_like_hub_id(name):
        return resolve_hub_model(name, model_config.revision, model_config.download_dir)
    hint = ""
    if name.lower() in PRESETS:
        hint = f"; {name!r} is a dummy preset: pass load_format='dummy' for random weights"
    raise ModelLoadError(f"model path {name!r} does not exist{hint}")


def _parse_arch_config(config: dict, where: str | os.PathLike) -> ModelArchConfig:
    try:
        return ModelArchConfig.from_hf_dict(config)
    except KeyError as error:
        raise ModelLoadError(f"config of {str(where)!r} lacks field {error}") from error
    except UnsupportedModelError as error:
        raise UnsupportedModelError(f"{str(where)!r}: {error}") from error
    except (TypeError, ValueError) as error:
        raise ModelLoadError(f"config of {str(where)!r} is invalid: {error}") from error


def _dummy_arch_config(name: str | None, overrides: dict) -> tuple[ModelArchConfig, str | None]:
    """A preset (None means the default model's shape) or a local folder's config.json."""
    preset = get_preset(name or "smollm2-135m")
    if preset is not None:
        preset.update(overrides)
        return _parse_arch_config(preset, f"preset {name}"), None
    path = Path(name).expanduser()
    if path.is_dir():
        return _parse_arch_config(read_hf_config(path, overrides), path), str(path)
    raise ModelLoadError(
        f"dummy model {name!r} is neither a preset ({', '.join(PRESETS)}) nor a folder with a "
        "config.json"
    )


def _load_gguf(
    path: Path,
    model_config: ModelConfig,
    overrides: dict,
    device: torch.device,
    dtype: torch.dtype,
    attention_backend: AttentionBackend,
) -> LoadedModel:
    # Imported here: the gguf package is only needed for GGUF files.
    from ladle.model.loader.gguf import (
        count_gguf_weights,
        iter_gguf_weights,
        open_gguf,
        read_gguf_arch_config,
    )

    reader = open_gguf(path)
    arch_config = read_gguf_arch_config(path, reader)
    if overrides:
        fields = {field.name for field in dataclasses.fields(ModelArchConfig)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ModelLoadError(
                f"hf_overrides {unknown} do not apply to GGUF file {str(path)!r}; it accepts "
                f"{', '.join(sorted(fields))}"
            )
        arch_config = dataclasses.replace(arch_config, **overrides)
    _check_max_model_len(arch_config, model_config, str(path))
    model = build_model(arch_config, device, dtype, attention_backend)
    # Tensors kept in their own format never fill the float weights, whose untouched memory
    # the kernel never commits.
    keep_native = resolve_quantization(model_config, "gguf", device) == "gguf"
    weights = with_progress(
        iter_gguf_weights(path, reader, device, keep_native),
        count_gguf_weights(reader),
        "Loading GGUF",
    )
    _load_weights(model, weights, str(path))
    return LoadedModel(model, arch_config, str(path), "gguf")


def _load_weights(
    model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], where: str
) -> None:
    try:
        model.load_weights(weights)
    except ModelLoadError as error:
        if where in str(error):
            raise
        raise ModelLoadError(f"{where!r}: {error}") from error


def _check_max_model_len(
    arch_config: ModelArchConfig, model_config: ModelConfig, where: str | None
) -> None:
    # The rotary table, and the model's training, stop at max_position_embeddings.
    max_model_len = model_config.max_model_len
    if max_model_len is not None and max_model_len > arch_config.max_position_embeddings:
        raise ModelLoadError(
            f"max_model_len={max_model_len} exceeds the max_position_embeddings "
            f"({arch_config.max_position_embeddings}) of {where!r}"
        )
