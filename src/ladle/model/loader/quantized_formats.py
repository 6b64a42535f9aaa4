"""Quantized Hugging Face checkpoints: read their `quantization_config`, convert their tensors
to ladle's canonical layout as they stream in, and write them (`ladle quantize`).

Formats (int4 in groups of 128 as written; read also in groups of 32, 64, 256 or per channel;
every tensor named after its checkpoint projection):
  hf-fp8  quant_method "fp8", activation_scheme "dynamic": `weight` float8_e4m3fn [N, K] and
          `weight_scale` float32. ladle writes one scale per output channel, [N, 1], or with
          `weight_block_size: [b, b]` (`ladle quantize --weight-block-size b`, what
          transformers reads) one per block, `weight_scale_inv` [ceil(N/b), ceil(K/b)]. It
          reads per-channel ([N] or [N, 1]), per-tensor ([] or [1], expanded exactly), and
          blocks of any rows x 32, 64, 128 or 256 inputs as named by weight_block_size
          (DeepSeek's and Qwen3-FP8's 128x128), kept exactly and run block-scaled
          (quant/fp8_block.py).
  gptq    quant_method "gptq", bits 4: `qweight` int32 [K/8, N] (8 inputs per word, low nibble
          first), `qzeros` int32 [G, N/8] (8 outputs per word, storing zero - 1 as GPTQ v1 does;
          checkpoint_format "gptq_v2" stores the zero),
          `scales` float16 [G, N], `g_idx` int32 [K] (k // 128; with desc_act true any order
          of groups of 128, the inputs put in group order at load: quant/act_order.py).
  awq     quant_method "awq", bits 4, version "gemm": `qweight` int32 [K, N/8] and `qzeros`
          int32 [G, N/8], 8 outputs per word in AWQ's interleaved order, `scales` float16 [G, N].
  ladle   quant_method "ladle" with "method": "int8": `weight` int8 [N, K], `weight_scale`
          float32 [N, 1] (W8A8; no other engine reads this one).
A malformed checkpoint raises ModelLoadError naming the tensor (or the config field).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import torch

from ladle.config import CHECKPOINT_FORMATS
from ladle.model.layers.quant import QuantMethod, get_quant_method
from ladle.model.layers.quant.act_order import PERMUTATION
from ladle.model.layers.quant.fp8 import FP8_DTYPE
from ladle.model.layers.quant.fp8_block import Fp8BlockMethod, check_block_size
from ladle.model.layers.quant.int4 import GROUP_SIZE, GROUP_SIZES, Int4Method, num_groups
from ladle.model.loader import compressed_tensors as ct
from ladle.model.loader.checkpoint_tensors import (
    PER_CHANNEL,
    check_g_idx,
    expect_shape,
    fp8_canonical,
    int4_input_order,
    pack_rows,
    per_channel_as_groups,
    unpack_rows,
)
from ladle.model.loader.errors import ModelLoadError

FORMATS = CHECKPOINT_FORMATS
DEFAULT_FORMAT = {"fp8": "hf-fp8", "int8": "ladle", "int4": "gptq"}
# The method each format holds (compressed-tensors holds any of the three).
FORMAT_METHOD = {"hf-fp8": "fp8", "gptq": "int4", "awq": "int4", "ladle": "int8"}
# A decoder layer's projection weight: the tensors the GPU methods quantize (Mixtral names its
# experts' projections w1, w2, w3).
LINEAR_WEIGHT = re.compile(r"\.layers\.\d+\..*(_proj|\.experts\.\d+\.w[123])\.weight$")
LINEAR_PREFIX = re.compile(r"\.layers\.\d+\..*(_proj|\.experts\.\d+\.w[123])$")
# AWQ packs output column ORDER[i] into nibble i of each word.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
SHARD_BYTES = 2 << 30


@dataclass(frozen=True)
class CheckpointQuantization:
    """What a checkpoint's quantization_config says: ladle's method and the tensor format."""

    method: str
    format: str
    symmetric: bool = False
    # Checkpoint modules left in float (modules_to_not_convert, vLLM fp8's ignored_layers,
    # compressed-tensors' ignore), and ignore's 're:' patterns not yet matched to module names.
    float_modules: tuple[str, ...] = ()
    float_module_patterns: tuple[str, ...] = ()
    # What ladle runs differently from the checkpoint's own scheme, said at load.
    note: str | None = None
    # fp8 weight blocks (rows, inputs) when the checkpoint's scales are per block.
    block_size: tuple[int, int] | None = None
    # int4 act-order (GPTQ desc_act): each projection's g_idx scatters its groups, so its inputs
    # are put in group order at load and gathered at run time (quant/act_order.py).
    act_order: bool = False
    # int4: the checkpoint's group size (-1: one group per output channel, read as ladle's
    # groups of 128 repeating it).
    group_size: int = GROUP_SIZE
    # gptq checkpoint_format "gptq_v2" (GPTQModel): qzeros hold the zero, not zero - 1.
    gptq_v2: bool = False

    def quant_method(self) -> QuantMethod:
        if self.block_size is not None:
            return Fp8BlockMethod(*self.block_size)
        if self.method == "int4":
            return Int4Method(self.symmetric, self.runtime_group_size)
        return get_quant_method(self.method, symmetric=self.symmetric)

    @property
    def runtime_group_size(self) -> int:
        """The int4 group size the layers run: the checkpoint's, or 128 for per-channel."""
        return GROUP_SIZE if self.group_size == PER_CHANNEL else self.group_size


def read_checkpoint_quantization(config: dict, where: str) -> CheckpointQuantization | None:
    """The checkpoint's quantization from config.json, None for a float checkpoint."""
    qc = config.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ModelLoadError(f"{where!r}: quantization_config is not a JSON object")
    kind = qc.get("quant_method")
    if kind == ct.QUANT_METHOD:
        method, symmetric, note = ct.read_scheme(qc, where)
        names, patterns = ct.split_ignore(qc, where)
        block_size = _checked_block_size(ct.block_structure(qc, where), where, "block_structure")
        group_size = ct.int4_group_size(qc) if method == "int4" else GROUP_SIZE
        return CheckpointQuantization(
            method,
            ct.FORMAT,
            symmetric,
            names,
            patterns,
            note,
            block_size,
            ct.act_order(qc),
            group_size,
        )
    float_modules = qc.get("modules_to_not_convert") or qc.get("ignored_layers") or ()
    if not isinstance(float_modules, list | tuple) or not all(
        isinstance(name, str) for name in float_modules
    ):
        raise ModelLoadError(f"{where!r}: modules_to_not_convert is not a list of module names")
    return replace(_read_method(qc, kind, where), float_modules=tuple(float_modules))


def _read_method(qc: dict, kind, where: str) -> CheckpointQuantization:
    """ladle's method and format for a quantization_config; ModelLoadError when unsupported."""

    def bad(field: str, expected: str) -> ModelLoadError:
        return ModelLoadError(
            f"{where!r}: quantization_config {field}={qc.get(field)!r} is not supported "
            f"({kind} checkpoints load with {expected})"
        )

    if kind == "fp8":
        if qc.get("activation_scheme", "dynamic") != "dynamic":
            raise bad("activation_scheme", "'dynamic'")
        block_size = _checked_block_size(qc.get("weight_block_size"), where, "weight_block_size")
        return CheckpointQuantization("fp8", "hf-fp8", block_size=block_size)
    if kind in ("gptq", "awq"):
        if qc.get("bits", qc.get("w_bit")) != 4:
            raise bad("bits", "4")
        group_size = qc.get("group_size", qc.get("q_group_size"))
        if group_size not in (*GROUP_SIZES, PER_CHANNEL):
            field = "group_size" if "group_size" in qc else "q_group_size"
            raise bad(field, f"{', '.join(map(str, GROUP_SIZES))} or {PER_CHANNEL}")
        if kind == "gptq":
            checkpoint_format = qc.get("checkpoint_format", "gptq")
            if checkpoint_format not in ("gptq", "gptq_v2"):
                raise bad("checkpoint_format", "'gptq' or 'gptq_v2'")
            return CheckpointQuantization(
                "int4",
                "gptq",
                gptq_v2=checkpoint_format == "gptq_v2",
                symmetric=bool(qc.get("sym", True)),
                act_order=bool(qc.get("desc_act", False)),
                group_size=group_size,
            )
        if qc.get("version", "gemm").lower() != "gemm":
            raise bad("version", "'gemm'")
        if not qc.get("zero_point", True):
            raise bad("zero_point", "true")
        return CheckpointQuantization("int4", "awq", group_size=group_size)
    if kind == "ladle":
        if qc.get("method") != "int8":
            raise bad("method", "'int8'")
        return CheckpointQuantization("int8", "ladle")
    raise ModelLoadError(
        f"{where!r}: quant_method {kind!r} is not supported; ladle loads fp8, gptq, awq "
        "(4-bit, group 128), compressed-tensors (fp8, int8, int4 group 128) and its own int8 "
        "checkpoints"
    )


def _checked_block_size(value, where: str, field: str) -> tuple[int, int] | None:
    """A config's fp8 weight block [rows, inputs] (None: per-channel or per-tensor scales);
    ModelLoadError naming the field when ladle cannot run it."""
    if value is None:
        return None
    if not (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(size, int) and not isinstance(size, bool) for size in value)
    ):
        raise ModelLoadError(
            f"{where!r}: quantization_config {field}={value!r} is not [rows, inputs]"
        )
    try:
        check_block_size(*value)
    except ValueError as error:
        raise ModelLoadError(f"{where!r}: quantization_config {field}={value!r}: {error}") from None
    return (value[0], value[1])


def with_matched_float_modules(
    fmt: CheckpointQuantization, tensor_names: list[str]
) -> CheckpointQuantization:
    """`fmt` with its ignore patterns matched against the checkpoint's projection modules (the
    prefixes of its projection tensors), so the float ones are known before the weights
    stream in."""
    if not fmt.float_module_patterns:
        return fmt
    modules = {name.rpartition(".")[0] for name in tensor_names}
    projections = {module for module in modules if LINEAR_PREFIX.search(module)}
    matched = ct.matching_modules(fmt.float_module_patterns, projections)
    return replace(fmt, float_modules=fmt.float_modules + matched, float_module_patterns=())


# ----------------------------------------------------------------------------- reading


def _int4_canonical(
    prefix: str, parts: dict[str, torch.Tensor], fmt: CheckpointQuantization
) -> dict[str, torch.Tensor]:
    qweight, scales = parts["qweight"], parts["scales"]
    groups, num_outputs = scales.shape
    if fmt.format == "gptq":
        num_words = qweight.shape[0]
        num_inputs = num_words * 8
        expect_shape(prefix + "qweight", qweight, (num_words, num_outputs), "[K/8, N]")
        packed = qweight.t().contiguous()
        zeros = unpack_rows(parts["qzeros"], num_outputs).int()
        if not fmt.gptq_v2:
            zeros += 1  # GPTQ v1 stores zero - 1 (GPTQModel's v2 stores the zero itself)
        zero_order = tuple(range(8))
    else:
        num_inputs = qweight.shape[0]
        expect_shape(prefix + "qweight", qweight, (num_inputs, -(-num_outputs // 8)), "[K, N/8]")
        codes = unpack_rows(qweight, num_outputs, AWQ_ORDER)  # [K, N]
        packed = pack_rows(codes.t())
        zeros = None
        zero_order = AWQ_ORDER
    per_channel = fmt.group_size == PER_CHANNEL
    expected_groups = 1 if per_channel else num_groups(num_inputs, fmt.group_size)
    if groups != expected_groups:
        group = "per channel" if per_channel else str(fmt.group_size)
        raise ModelLoadError(
            f"tensor {prefix + 'scales'!r} has {groups} groups for {num_inputs} inputs: group "
            f"size {num_inputs / max(groups, 1):g}, expected {group} ({expected_groups} groups)"
        )
    expect_shape(prefix + "qzeros", parts["qzeros"], (groups, -(-num_outputs // 8)), "[G, N/8]")
    if zeros is None:
        zeros = unpack_rows(parts["qzeros"], num_outputs, zero_order).int()
    if zeros.max() > 15 or zeros.min() < 0:
        raise ModelLoadError(f"tensor {prefix + 'qzeros'!r} holds a zero outside 0..15")
    if per_channel:
        scales, zeros = per_channel_as_groups(scales, zeros, num_inputs)
    packed, permutation = int4_input_order(
        prefix + "g_idx", parts.get("g_idx"), packed, num_inputs, fmt.group_size, fmt.act_order
    )
    canonical = {
        "weight_packed": packed,
        "weight_scale": scales.t().to(torch.float16).contiguous(),
        "weight_zero": zeros.t().to(torch.uint8).contiguous(),
    }
    return canonical if permutation is None else {**canonical, PERMUTATION: permutation}


def _required_parts(fmt: CheckpointQuantization) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(parts every quantized projection needs, optional ones) for a format."""
    if fmt.format == "hf-fp8":
        return ("weight",), ("weight_scale", "weight_scale_inv", "input_scale")
    if fmt.format == "ladle":
        return ("weight", "weight_scale"), ()
    if fmt.format == ct.FORMAT:
        return ct.required_parts(fmt.method, fmt.symmetric, fmt.act_order)
    if fmt.act_order:
        return ("qweight", "qzeros", "scales", "g_idx"), ()
    return ("qweight", "qzeros", "scales"), ("g_idx",)


def convert_quantized_weights(
    weights: Iterable[tuple[str, torch.Tensor]], fmt: CheckpointQuantization
) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream a quantized checkpoint's tensors as ladle's canonical ones. A projection's parts
    are held until all have arrived; float projection weights (layers a quantizer skipped) are
    quantized here, so every Linear ends up in the method's layout."""
    required, optional = _required_parts(fmt)
    method = fmt.quant_method()
    pending: dict[str, dict[str, torch.Tensor]] = {}
    emitted: set[str] = set()
    for name, tensor in weights:
        prefix, _, part = name.rpartition(".")
        is_part = part in required or part in optional
        is_float_linear = (
            LINEAR_WEIGHT.search(name)
            and tensor.is_floating_point()
            and (tensor.dtype != FP8_DTYPE)
        )
        if is_float_linear and prefix in fmt.float_modules:
            yield name, tensor
            continue
        if is_float_linear:
            for part_name, value in method.quantize(tensor).items():
                yield f"{prefix}.{part_name}", value
            continue
        if not LINEAR_PREFIX.search(prefix):
            _check_float(name, tensor, is_part)
            yield name, tensor
            continue
        if not is_part:
            yield name, tensor
            continue
        if prefix in emitted:  # an optional part stored after the others (another shard)
            if part == "g_idx" and not fmt.act_order and fmt.group_size != PER_CHANNEL:
                check_g_idx(name, tensor, fmt.group_size)
            continue
        parts = pending.setdefault(prefix, {})
        parts[part] = tensor
        if _is_complete(parts, required, fmt):
            emitted.add(prefix)
            yield from _emit(prefix, pending.pop(prefix), fmt)
    for prefix, parts in pending.items():
        scale_name = "weight_scale_inv" if fmt.block_size else "weight_scale"
        names = list(required) + ([scale_name] if fmt.format == "hf-fp8" else [])
        missing = [f"{prefix}.{key}" for key in names if key not in parts]
        raise ModelLoadError(f"{fmt.format} checkpoint is missing tensor(s) {', '.join(missing)}")


def _check_float(name: str, tensor: torch.Tensor, is_part: bool) -> None:
    """ModelLoadError for a quantized tensor outside the decoder's projections (a quantized LM
    head or embedding), which ladle keeps in float and would otherwise cast silently."""
    is_code = tensor.dtype in (torch.int8, torch.int32, FP8_DTYPE) and name.endswith("weight")
    if is_code or (is_part and not name.endswith(".weight")):
        raise ModelLoadError(
            f"tensor {name!r} is quantized ({tensor.dtype}), but ladle quantizes only the decoder "
            "layers' projections and keeps this module in float"
        )


def _is_complete(
    parts: dict[str, torch.Tensor], required: tuple[str, ...], fmt: CheckpointQuantization
) -> bool:
    has_scale = fmt.format != "hf-fp8" or "weight_scale" in parts or "weight_scale_inv" in parts
    return has_scale and all(key in parts for key in required)


def _emit(
    prefix: str, parts: dict[str, torch.Tensor], fmt: CheckpointQuantization
) -> Iterator[tuple[str, torch.Tensor]]:
    prefix_dot = prefix + "."
    if fmt.format == "hf-fp8":
        canonical = fp8_canonical(prefix_dot, parts, fmt.block_size)
    elif fmt.format == ct.FORMAT:
        canonical = ct.canonical(prefix_dot, parts, fmt)
    elif fmt.format == "ladle":
        weight, scale = parts["weight"], parts["weight_scale"]
        if weight.dtype != torch.int8:
            raise ModelLoadError(f"tensor {prefix_dot + 'weight'!r} is {weight.dtype}, not int8")
        expect_shape(prefix_dot + "weight_scale", scale, (weight.shape[0], 1), "[N, 1]")
        canonical = {"weight": weight, "weight_scale": scale.float().reshape(-1)}
    else:
        canonical = _int4_canonical(prefix_dot, parts, fmt)
    for part_name, value in canonical.items():
        yield prefix_dot + part_name, value
