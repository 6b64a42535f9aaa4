"""The calibration pass of `ladle quantize --algorithm gptq|awq|awq-gptq` and `--clip-search`: run
calibration token windows through a loaded float model one decoder layer at a time and quantize
each layer's projections from the inputs it actually sees (gptq.py, int4_clip.py, awq.py).

    inputs of layer 0 = the embedding of every window
    for each layer:
        run the windows through it with its float weights, accumulating x x^T at every Linear
        awq: search input scales per projection, fold them into the norms and up rows
        quantize each Linear with its Hessian; put the quantized (dequantized) weight in place
        run the windows through it again: the next layer's inputs, quantization error included

Only one layer's inputs for all windows are held at a time (hidden states and residual: for 128
windows x 512 tokens of an 8B model, 2 x 0.5 GiB in bfloat16 beside the model, twice that while
the next layer's are built), never every layer's activations. The model
itself stays loaded (in the dtype it was loaded in), as GPTQ tools do; its float weights are
overwritten by their quantized images as the pass goes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

import torch
from torch import nn

from ladle.attention.backend import get_attention_backend
from ladle.attention.metadata import AttentionMetadata
from ladle.config import ModelConfig, supported_dtypes
from ladle.kernels.dispatch import use_fused_kernels
from ladle.model.arch_config import UnsupportedModelError
from ladle.model.layers.linear import Linear, MergedLinear, QKVLinear
from ladle.model.layers.quant import QuantMethod
from ladle.model.layers.quant.awq import ALPHAS, search_input_scales
from ladle.model.layers.quant.float_projections import float_ladle_modules
from ladle.model.layers.quant.fp8 import Fp8Method
from ladle.model.layers.quant.gptq import (
    HessianAccumulator,
    dequantize_int4_scattered,
    gptq_fp8,
    gptq_int4,
    gptq_int4_act_order,
)
from ladle.model.layers.quant.int4 import (
    Int4Method,
    dequantize_int4_groups,
    pack_int4_rows,
    unpack_int4_rows,
)
from ladle.model.layers.quant.int4_clip import search_int4_groups
from ladle.model.layers.quant.rotation import rotate_residual_stream_, rotated_float_tensors
from ladle.model.loader import load_model
from ladle.model.loader.scale_tuning import teacher_targets, tune_scales_
from ladle.model.models.llama import to_checkpoint_name

BLOCK_SIZE = 16
# (weight [N, K], Hessian [K, K]) -> the method's canonical tensors
WeightQuantizer = Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


# --act-order: groups formed in act-order (desc_act, a g_idx per projection), or fixed first in
# the stored order (static groups).
ACT_ORDERS = (None, "dynamic", "static")


def gptq_quantizer(
    method: QuantMethod, clip: str | None = None, act_order: str | None = None
) -> WeightQuantizer:
    """The calibrated quantizer of `method` (int4 or fp8), writing its canonical tensors; int4
    groups' ranges by `clip` (gptq.CLIP_MODES), columns in act-order (ACT_ORDERS): with
    "dynamic" the canonical tensors also hold the inputs' `g_idx`, their codes in the original
    column order (a desc_act checkpoint's layout)."""
    if act_order not in ACT_ORDERS:
        raise ValueError(f"act_order {act_order!r} is not one of {ACT_ORDERS}")
    if isinstance(method, Int4Method):

        def quantize_int4(weight: torch.Tensor, hessian: torch.Tensor) -> dict[str, torch.Tensor]:
            if act_order == "dynamic":
                codes, scale, zero, g_idx = gptq_int4_act_order(
                    weight, hessian, method.symmetric, clip
                )
                extra = {"g_idx": g_idx}
            else:
                codes, scale, zero = gptq_int4(
                    weight, hessian, method.symmetric, clip, act_order=act_order == "static"
                )
                extra = {}
            return {
                "weight_packed": pack_int4_rows(codes),
                "weight_scale": scale,
                "weight_zero": zero,
                **extra,
            }

        return quantize_int4
    if isinstance(method, Fp8Method):

        def quantize_fp8(weight: torch.Tensor, hessian: torch.Tensor) -> dict[str, torch.Tensor]:
            codes, scale = gptq_fp8(weight, hessian)
            return {"weight": codes, "weight_scale": scale}

        return quantize_fp8
    raise ValueError(f"GPTQ calibration supports int4 and fp8, not {method.name}")


def clip_search_quantizer(method: QuantMethod) -> WeightQuantizer:
    """Round-to-nearest int4 with each group's range chosen by the activation-weighted clipping
    search (int4_clip.py), the weights being the Hessian's diagonal: no error compensation, so
    the pass costs two forward passes of the calibration windows and no column loop."""
    if not isinstance(method, Int4Method):
        raise ValueError(f"the clipping search applies to int4, not {method.name}")

    def quantize_int4(weight: torch.Tensor, hessian: torch.Tensor) -> dict[str, torch.Tensor]:
        codes, scale, zero = search_int4_groups(weight, hessian.diagonal(), method.symmetric)
        return {"weight_packed": pack_int4_rows(codes), "weight_scale": scale, "weight_zero": zero}

    return quantize_int4


def fold_input_scales_(
    layer: nn.Module,
    hessians: dict[str, torch.Tensor],
    symmetric: bool,
    alphas: tuple[float, ...] = ALPHAS,
    float_modules: Collection[str] = (),
) -> dict[str, torch.Tensor]:
    """AWQ's input scaling (quant/awq.py) on one decoder layer, folded where it is exact: down
    (1/s into the up rows of gate_up), then gate_up and qkv (1/s into the RMSNorm before each).
    o_proj is left alone (its input is the attention output, whose channels are v's only when
    every query head has its own kv head). The layer's weights and `hessians` are updated in
    place (H -> H / (s s^T), the statistics of the scaled inputs); returns the changed norm
    weights by their name in the layer. A fold that would change a module of `float_modules`
    (kept float, written from the source's weights) is skipped: down's scales change the up
    rows of gate_up."""

    def quantize(weight: torch.Tensor, importance: torch.Tensor) -> torch.Tensor:
        return dequantize_int4_groups(*search_int4_groups(weight, importance, symmetric))

    down, gate_up = layer.mlp.down_proj, layer.mlp.gate_up_proj
    folds = [
        ("mlp.down_proj", down, None),
        ("mlp.gate_up_proj", gate_up, "post_attention_layernorm"),
        ("self_attn.qkv_proj", layer.self_attn.qkv_proj, "input_layernorm"),
    ]
    changed = {}
    untouchable = set(float_modules)
    if "mlp.gate_up_proj" in untouchable:
        untouchable.add("mlp.down_proj")
    for name, linear, norm_name in folds:
        if name in untouchable:
            continue
        hessian = hessians[name]
        scales = search_input_scales(linear.weight.data, hessian, quantize, alphas)
        scales = scales.to(hessian.device)
        hessians[name] = hessian / scales[:, None] / scales[None, :]
        linear.weight.data.mul_(scales[None, :].to(linear.weight.dtype))
        if norm_name is None:  # down: the up projection's rows produce its inputs
            start, num_rows = gate_up.shard_rows(1)
            gate_up.weight.data[start : start + num_rows].div_(
                scales[:, None].to(gate_up.weight.dtype)
            )
            if gate_up.bias is not None:
                gate_up.bias.data[start : start + num_rows].div_(scales.to(gate_up.bias.dtype))
            continue
        norm = getattr(layer, norm_name)
        norm.weight.data.div_(scales.to(norm.weight.dtype))
        changed[f"{norm_name}.weight"] = norm.weight.data
    return changed


def _linears(layer: nn.Module) -> dict[str, nn.Module]:
    return {name: module for name, module in layer.named_modules() if isinstance(module, Linear)}


class _LayerRunner:
    """Runs one decoder layer over every calibration window, as the model's forward would."""

    def __init__(self, model: nn.Module, windows: list[list[int]]) -> None:
        config = model.config
        longest = max(map(len, windows))
        num_blocks = -(-longest // BLOCK_SIZE) + 1  # block 0 is the null block
        parameter = next(model.parameters())
        self.device, self.dtype = parameter.device, parameter.dtype
        self.kv_cache = torch.zeros(
            2,
            num_blocks,
            BLOCK_SIZE,
            config.num_key_value_heads,
            config.head_dim,
            dtype=self.dtype,
            device=self.device,
        )
        self.steps = []
        for window in windows:
            positions = torch.arange(len(window), device=self.device)
            metadata = AttentionMetadata.one_fresh_prompt(len(window), BLOCK_SIZE, self.device)
            self.steps.append((positions, metadata))
        self.rotary = model.model.rotary_emb

    def run(self, layer: nn.Module, states: list[tuple[torch.Tensor, torch.Tensor | None]]):
        outputs = []
        for (positions, metadata), (hidden, residual) in zip(self.steps, states, strict=True):
            tables = None if use_fused_kernels(hidden) else self.rotary.step_tables(positions)
            # The fused CUDA norm updates the residual in place; the first pass must not.
            residual = None if residual is None else residual.clone()
            outputs.append(layer(positions, hidden, residual, self.kv_cache, metadata, tables))
        return outputs


@torch.no_grad()
def calibrate_linears(
    model: nn.Module,
    windows: list[list[int]],
    quantizer: WeightQuantizer,
    log: Callable[[str], None] | None = None,
    float_layers: Collection[int] = (),
    fold_scales: bool = False,
    symmetric: bool = False,
    float_modules: Collection[str] = (),
) -> dict[str, dict[str, torch.Tensor]]:
    """Quantize every decoder Linear of `model` from calibration `windows` (token id lists),
    layer by layer, except in the decoder layers `float_layers`; returns {module name:
    canonical tensors}. The model's Linear weights are
    left holding the dequantized quantized weights (its float outputs are gone).
    `fold_scales`: AWQ's input scaling first (fold_input_scales_, int4 with `symmetric` groups);
    the norms it changes are returned too, as {norm module name: {"float": weight}}.
    `float_modules`: ladle module names within a layer ("self_attn.qkv_proj") left float in
    every layer (float_projections.py)."""
    runner = _LayerRunner(model, windows)
    device = runner.device
    states = [(model.model.embed_tokens(torch.tensor(w, device=device)), None) for w in windows]
    results: dict[str, dict[str, torch.Tensor]] = {}
    started = time.perf_counter()
    for index, layer in enumerate(model.model.layers):
        if index in float_layers:
            states = runner.run(layer, states)
            continue
        linears = _linears(layer)
        accumulators = {
            name: HessianAccumulator(module.input_size, device) for name, module in linears.items()
        }
        hooks = [
            module.register_forward_pre_hook(
                lambda _, inputs, accumulator=accumulators[name]: accumulator.add(inputs[0])
            )
            for name, module in linears.items()
        ]
        try:
            runner.run(layer, states)
        finally:
            for hook in hooks:
                hook.remove()
        hessians = {name: accumulator.hessian() for name, accumulator in accumulators.items()}
        if fold_scales:
            folded = fold_input_scales_(layer, hessians, symmetric, float_modules=float_modules)
            for norm_name, weight in folded.items():
                module_name = f"model.layers.{index}.{norm_name.removesuffix('.weight')}"
                results[module_name] = {"float": weight.cpu().clone()}
        for name, module in linears.items():
            if name in float_modules:
                continue
            canonical = quantizer(module.weight.data.float(), hessians[name])
            results[f"model.layers.{index}.{name}"] = _hold_quantized_(module, canonical)
        del accumulators, hessians
        states = runner.run(layer, states)
        if log is not None:
            log(
                f"layer {index + 1}/{len(model.model.layers)} quantized "
                f"({time.perf_counter() - started:.0f} s)"
            )
    return results


@torch.no_grad()
def round_linears_(
    model: nn.Module,
    method: QuantMethod,
    float_layers: Collection[int],
    float_modules: Collection[str],
) -> dict[str, dict[str, torch.Tensor]]:
    """calibrate_linears' result and effect for a method's own rounding to nearest, which needs
    no inputs: every decoder Linear outside `float_layers` and `float_modules` quantized where
    it is (what fp8's --tune-steps starts from)."""
    left_float = _float_linears(model, float_layers, float_modules)
    results = {}
    for index, layer in enumerate(model.model.layers):
        for name, module in _linears(layer).items():
            full_name = f"model.layers.{index}.{name}"
            if full_name not in left_float:
                canonical = method.quantize(module.weight.data.float())
                results[full_name] = _hold_quantized_(module, canonical)
    return results


def _hold_quantized_(module: nn.Module, canonical: dict[str, torch.Tensor]):
    """Put the weight a projection's canonical tensors stand for in `module` (what the layers
    after it are then calibrated on); returns the tensors on the CPU, for the writer."""
    dequantized = _dequantize(canonical, module.input_size)
    module.weight.data.copy_(dequantized.to(module.weight.dtype))
    return {key: value.cpu() for key, value in canonical.items()}


def _dequantize(canonical: dict[str, torch.Tensor], num_inputs: int) -> torch.Tensor:
    """The float32 weight a calibrated layer's canonical tensors stand for."""
    if "g_idx" in canonical:  # act-order groups
        codes = unpack_int4_rows(canonical["weight_packed"], num_inputs)
        scale, zero = canonical["weight_scale"], canonical["weight_zero"]
        return dequantize_int4_scattered(codes, scale, zero, canonical["g_idx"])
    method = Int4Method() if "weight_packed" in canonical else Fp8Method()
    return method.dequantize(canonical, num_inputs)


def by_checkpoint_name(
    model: nn.Module, results: dict[str, dict[str, torch.Tensor]]
) -> dict[str, dict[str, torch.Tensor]]:
    """calibrate_linears' results keyed by the checkpoint's weight names: a merged module's rows
    (q/k/v, gate/up) split back into its projections (every canonical tensor has rows on dim 0,
    and GPTQ treats rows independently, so the split equals quantizing each projection). A
    norm weight that AWQ's folding changed keeps its name: {"float": weight}."""
    named: dict[str, dict[str, torch.Tensor]] = {}
    for module_name, canonical in results.items():
        module = model.get_submodule(module_name)
        if not isinstance(module, Linear):
            named[f"{module_name}.weight"] = canonical
            continue
        if isinstance(module, QKVLinear):
            shards: list[str | int | None] = ["q", "k", "v"]
        elif isinstance(module, MergedLinear):
            shards = list(range(len(module.output_sizes)))
        else:
            shards = [None]
        for shard in shards:
            start, num_rows = module.shard_rows(shard)
            name = to_checkpoint_name(f"{module_name}.weight", shard)
            # Every tensor has the rows on dim 0 but an act-order g_idx, which is the inputs'
            # (a copy per projection: safetensors refuses tensors that share storage).
            named[name] = {
                key: value.clone()
                if key == "g_idx"
                else value.narrow(0, start, num_rows).contiguous()
                for key, value in canonical.items()
            }
    return named


def calibrate_checkpoint(
    source: str,
    method: QuantMethod,
    dtype: torch.dtype,
    windows: list[list[int]],
    search_clip: bool = False,
    log: Callable[[str], None] | None = None,
    float_layers: Collection[int] = (),
    algorithm: str = "gptq",
    act_order: str | None = None,
    float_projections: Collection[str] = (),
    rotation_seed: int | None = None,
    tune_steps: int = 0,
) -> dict[str, dict[str, torch.Tensor]]:
    """Load the float model at `source` (folder or GGUF) through ladle in `dtype` (on the GPU
    when there is one) and quantize its projections from `windows` with GPTQ (`algorithm`
    "gptq", optionally with the clipping search and in act-order, ACT_ORDERS), with
    round-to-nearest and the weighted clipping search alone ("rtn"; for fp8 its own rounding to
    nearest, round_linears_, the start of its tuning), with AWQ's
    input scaling folded into the norms and up rows before that search ("awq", int4 only), or
    with AWQ's scaling and then GPTQ with the weighted clipping search inside ("awq-gptq", int4
    only), leaving `float_projections` (checkpoint names: q_proj, ...) float; returns
    canonical tensors by checkpoint weight name, for write_quantized_checkpoint(calibrated=...).
    `rotation_seed`: a random rotation folded into the residual stream first (rotation.py); the
    result then also holds every tensor the rotation changed and calibration did not quantize
    (embedding, untied LM head, norms, projections left float) as {"float": tensor}.
    `tune_steps` (int4 and fp8): that many steps of scale_tuning.tune_scales_ after calibration,
    against the float model's distributions on the same windows; every norm is then in the
    result."""
    if act_order and algorithm not in ("gptq", "awq-gptq"):
        raise ValueError(f"act-order is a GPTQ option; algorithm {algorithm!r} has no column order")
    if algorithm == "gptq":
        quantizer = gptq_quantizer(method, "shrink" if search_clip else None, act_order)
    elif algorithm == "awq-gptq":
        quantizer = gptq_quantizer(method, "weighted", act_order)
    elif algorithm == "rtn" and isinstance(method, Fp8Method):
        quantizer = None  # round_linears_ below: no inputs needed
    elif algorithm in ("rtn", "awq"):
        quantizer = clip_search_quantizer(method)
    else:
        raise ValueError(f"calibration algorithm {algorithm!r} is not gptq, awq, awq-gptq or rtn")
    if tune_steps and not isinstance(method, (Int4Method, Fp8Method)):
        raise ValueError(f"scale tuning (--tune-steps) applies to int4 and fp8, not {method.name}")
    dtype_name = next(name for name, value in supported_dtypes().items() if value == dtype)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    config = ModelConfig(model=str(source), quantization="none", dtype=dtype_name)
    loaded = load_model(config, device, dtype, get_attention_backend(device))
    if loaded.arch_config.num_experts:
        raise UnsupportedModelError(
            f"{str(source)!r} is a {loaded.arch_config.architecture}: ladle quantize does not "
            "quantize mixtures of experts yet (quantized experts: issue 35)"
        )
    model = loaded.model
    symmetric = getattr(method, "symmetric", False)
    fold = algorithm in ("awq", "awq-gptq")
    float_modules = float_ladle_modules(float_projections)
    if rotation_seed is not None:
        rotate_residual_stream_(model, rotation_seed)
    targets = teacher_targets(model, windows) if tune_steps else None
    if quantizer is None:
        results = round_linears_(model, method, float_layers, float_modules)
    else:
        results = calibrate_linears(
            model, windows, quantizer, log, float_layers, fold, symmetric, float_modules
        )
    if tune_steps:
        group_size = getattr(method, "group_size", None)
        tune_scales_(model, windows, results, targets, tune_steps, group_size, log=log)
    if rotation_seed is not None:
        for name, tensor in rotated_float_tensors(model).items():
            results[name] = {"float": tensor.cpu().clone()}
        for name, module in _float_linears(model, float_layers, float_modules).items():
            results[name] = {"float": module.weight.data.cpu().clone()}
    return by_checkpoint_name(model, results)


def _float_linears(
    model: nn.Module, float_layers: Collection[int], float_modules: Collection[str]
) -> dict[str, nn.Module]:
    """The decoder Linears calibration left float, by module name."""
    kept = {}
    for index, layer in enumerate(model.model.layers):
        for name, module in _linears(layer).items():
            if index in float_layers or name in float_modules:
                kept[f"model.layers.{index}.{name}"] = module
    return kept
