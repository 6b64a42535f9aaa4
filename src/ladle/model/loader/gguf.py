"""GGUF checkpoints: the model shape from the header, and the weights under Hugging Face names.

The header is read by `gguf_header` (no Python object per vocabulary string: ~0.1 s instead of
the `gguf` package reader's ~10 s), and quantized tensors are dequantized to float32 as they are
read by `gguf_dequant` (vectorised torch, on the target device), so the model code sees the same
weights as for a safetensors checkpoint and needs no GGUF-specific path. A caller that wants
both the config and the weights opens the file once with `open_gguf` and passes the header on.
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType

from ladle.model.arch_config import SUPPORTED_ARCHITECTURES, ModelArchConfig, UnsupportedModelError
from ladle.model.layers.group_quant import GroupQuantizedRows
from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.gguf_dequant import dequantize
from ladle.model.loader.gguf_header import (
    GGUFFormatError,
    GGUFHeader,
    GGUFTensorInfo,
    read_gguf_header,
)
from ladle.model.loader.gguf_native import NATIVE_TYPES, native_group_rows

# general.architecture -> the Hugging Face architecture whose checkpoint layout it mirrors.
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}

# Names outside the decoder blocks.
_GLOBAL_TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Names inside block N: the part after "blk.N.".
_BLOCK_TENSOR_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_NAME_PATTERN = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
# Precomputed llama3 rope frequency factors: ladle recomputes them from the config instead.
_SKIPPED_TENSOR_NAMES = {"rope_freqs.weight"}


class UnsupportedGGUFError(ModelLoadError, UnsupportedModelError):
    """A readable GGUF whose architecture or features ladle cannot run."""


def open_gguf(path: str | os.PathLike) -> GGUFHeader:
    """Parse a GGUF file's header (the tensor data stays memory-mapped until read).

    Raises ModelLoadError naming the file when it is missing, truncated or not a GGUF file.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"GGUF file {str(path)!r} does not exist")
    try:
        return read_gguf_header(path)
    except (GGUFFormatError, OSError, ValueError, struct.error) as error:
        raise ModelLoadError(
            f"GGUF file {str(path)!r} is truncated or corrupt ({type(error).__name__}: {error})"
        ) from error


def _field(reader: GGUFHeader, key: str, default=None):
    value = reader.fields.get(key)
    if value is None:
        return default
    if isinstance(value, np.generic):
        return value.item()
    return value


def _architecture(reader, path: Path) -> tuple[str, str]:
    gguf_arch = _field(reader, "general.architecture")
    if gguf_arch not in GGUF_ARCHITECTURES:
        raise UnsupportedGGUFError(
            f"GGUF file {str(path)!r} has architecture {gguf_arch!r}; ladle reads GGUF "
            f"architectures {', '.join(GGUF_ARCHITECTURES)}"
        )
    return gguf_arch, GGUF_ARCHITECTURES[gguf_arch]


def read_gguf_arch_config(path: str | os.PathLike, reader=None) -> ModelArchConfig:
    """Build the model shape from a GGUF header (llama, qwen2 and qwen3 architectures).

    reader: an `open_gguf(path)` result to reuse; opened here when None.
    """
    path = Path(path)
    reader = reader if reader is not None else open_gguf(path)
    gguf_arch, architecture = _architecture(reader, path)

    def arch_field(key: str, default=None):
        return _field(reader, f"{gguf_arch}.{key}", default)

    tensor_names = {tensor.name for tensor in reader.tensors}
    try:
        hidden_size = int(arch_field("embedding_length"))
        num_heads = int(arch_field("attention.head_count"))
        num_layers = int(arch_field("block_count"))
        intermediate_size = int(arch_field("feed_forward_length"))
    except TypeError as error:  # a required key is missing, so int(None)
        raise ModelLoadError(
            f"GGUF file {str(path)!r} lacks a required {gguf_arch}.* shape key"
        ) from error
    head_dim = int(arch_field("attention.key_length") or hidden_size // num_heads)
    rotary_dim = arch_field("rope.dimension_count")
    if rotary_dim is not None and int(rotary_dim) != head_dim:
        raise UnsupportedGGUFError(
            f"GGUF file {str(path)!r} uses partial rotary embeddings "
            f"({rotary_dim} of {head_dim} dims), which ladle does not support"
        )
    embedding = reader.tensor("token_embd.weight")
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if embedding is not None:
        # The embedding's rows are what the model's shapes must match; the token list (which
        # {arch}.vocab_size, absent from many files, repeats) has the same length in files
        # llama.cpp writes, as it pads the list to the matrix.
        vocab_size = int(embedding.dims[1])
    elif tokens is not None:
        vocab_size = len(tokens)
    else:
        raise ModelLoadError(f"GGUF file {str(path)!r} has no token_embd.weight")
    rope_theta = float(arch_field("rope.freq_base", 10000.0))
    switches = SUPPORTED_ARCHITECTURES[architecture]
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    return ModelArchConfig(
        architecture=architecture,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=int(arch_field("attention.head_count_kv") or num_heads),
        head_dim=head_dim,
        rms_norm_eps=float(arch_field("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=rope_theta,
        max_position_embeddings=int(arch_field("context_length", 2048)),
        # llama.cpp's converter drops output.weight when it is the embedding matrix.
        tie_word_embeddings="output.weight" not in tensor_names,
        # Read from the file rather than assumed per architecture: the biases are there or not.
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm=switches["qk_norm"],
        rope_scaling=_rope_scaling(reader, path, gguf_arch, rope_theta, head_dim),
        bos_token_id=None if bos is None else int(bos),
        eos_token_ids=read_gguf_eos_token_ids(path, reader=reader),
    )


def read_gguf_eos_token_ids(path: str | os.PathLike, reader=None) -> tuple[int, ...]:
    """The end-of-sequence id and, when it differs, llama.cpp's end-of-turn id (both stop chat)."""
    reader = reader if reader is not None else open_gguf(path)
    eos_ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"):
        value = _field(reader, key)
        if value is not None and int(value) not in eos_ids:
            eos_ids.append(int(value))
    return tuple(eos_ids)


def _rope_scaling(reader, path: Path, gguf_arch: str, rope_theta: float, head_dim: int):
    scaling_type = _field(reader, f"{gguf_arch}.rope.scaling.type")
    if scaling_type not in (None, "none"):
        raise UnsupportedGGUFError(
            f"GGUF file {str(path)!r} uses rope scaling {scaling_type!r}, which ladle does not "
            "support"
        )
    rope_freqs = reader.tensor("rope_freqs.weight")
    if rope_freqs is None:
        return None
    # llama3 rope scaling is stored only as per-frequency factors; recover its parameters.
    factors = _dequantize(reader, rope_freqs, torch.device("cpu")).double().numpy().reshape(-1)
    scaling = fit_llama3_rope_scaling(factors, rope_theta, head_dim)
    if scaling is None:
        raise UnsupportedGGUFError(
            f"GGUF file {str(path)!r} has rope frequency factors that match no llama3 rope "
            "scaling ladle can reproduce"
        )
    return scaling


def llama3_rope_factors(scaling: dict, rope_theta: float, head_dim: int) -> np.ndarray:
    """The per-frequency divisors that llama3 rope scaling applies (one per rotary pair)."""
    inv_freq = 1.0 / rope_theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    original = scaling["original_max_position_embeddings"]
    low, high, factor = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
    smooth = (original / wavelen - low) / (high - low)
    blended = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(
        wavelen < original / high, 1.0, np.where(wavelen > original / low, factor, blended)
    )


def fit_llama3_rope_scaling(factors: np.ndarray, rope_theta: float, head_dim: int) -> dict | None:
    """Find llama3 rope-scaling parameters that reproduce stored factors; None when none do.

    Released llama3 models use small round values, so a search over those is exact in practice.
    """
    if factors.shape != (head_dim // 2,):
        return None
    if np.allclose(factors, 1.0):
        return None
    factor = float(factors.max())
    # Only original/low and original/high matter (scaling all three alike changes nothing), so
    # several settings fit; trying low_freq_factor=1 first returns the one Meta published.
    for low in (1.0, 2.0, 4.0, 0.5):
        for high in (2.0, 4.0, 8.0, 16.0, 32.0, 1.0):
            if high <= low:
                continue
            for original in (2**exponent for exponent in range(10, 18)):
                scaling = {
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": original,
                }
                if np.allclose(
                    llama3_rope_factors(scaling, rope_theta, head_dim), factors, rtol=1e-4
                ):
                    return scaling
    return None


def _dequantize(reader: GGUFHeader, tensor: GGUFTensorInfo, device: torch.device) -> torch.Tensor:
    """A tensor's float32 values on `device` (an owned copy, never a view of the memory map)."""
    path = reader.path
    try:
        return dequantize(reader.tensor_bytes(tensor), tensor.ggml_type, tensor.shape, device)
    except NotImplementedError as error:
        type_name = GGMLQuantizationType(tensor.ggml_type).name
        raise UnsupportedGGUFError(
            f"GGUF file {str(path)!r}: tensor {tensor.name} has type {type_name}, which ladle "
            "cannot dequantize"
        ) from error
    except (ValueError, RuntimeError) as error:
        raise ModelLoadError(
            f"GGUF file {str(path)!r}: tensor {tensor.name} is corrupt ({error})"
        ) from error


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face checkpoint name of a GGUF tensor; None for tensors ladle skips."""
    if gguf_name in _SKIPPED_TENSOR_NAMES:
        return None
    if gguf_name in _GLOBAL_TENSOR_NAMES:
        return _GLOBAL_TENSOR_NAMES[gguf_name]
    match = _BLOCK_NAME_PATTERN.fullmatch(gguf_name)
    if match is None or match.group(2) not in _BLOCK_TENSOR_NAMES:
        raise KeyError(gguf_name)
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{_BLOCK_TENSOR_NAMES[part]}.{kind}"


def unpermute_rope_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation for llama models.

    llama.cpp rotates interleaved pairs (x0, x1), (x2, x3), ... whereas Hugging Face's llama
    rotates the two halves of each head, so the converter reorders each head's rows from
    [half A | half B] to [a0 b0 a1 b1 ...]. This puts them back.
    """
    rows = weight.shape[0]
    head_rows = rows // num_heads
    return (
        weight.reshape(num_heads, head_rows // 2, 2, *weight.shape[1:])
        .transpose(1, 2)
        .reshape(weight.shape)
    )


def count_gguf_weights(reader: GGUFHeader) -> int:
    """How many tensors iter_gguf_weights yields (for a progress bar's total)."""
    return sum(1 for tensor in reader.tensors if tensor.name not in _SKIPPED_TENSOR_NAMES)


def iter_gguf_weights(
    path: str | os.PathLike,
    reader: GGUFHeader | None = None,
    device: torch.device | str = "cpu",
    keep_native: bool = False,
) -> Iterator[tuple[str, torch.Tensor | GroupQuantizedRows]]:
    """Yield (Hugging Face name, float32 tensor on `device`) for every weight in a GGUF file.

    Tensors are dequantized one at a time (on `device`, so on the GPU when the model goes there),
    so peak memory is one float32 tensor beyond the model. lm_head.weight is yielded only when
    the file has an output matrix (untied embeddings).
    reader: an `open_gguf(path)` result to reuse; opened here when None.
    keep_native: yield 2-D Q8_0/Q4_0/Q4_1/Q4_K/Q6_K tensors as GroupQuantizedRows (CPU) in their
    own precision instead of dequantizing them (gguf_native.py).
    """
    path = Path(path)
    reader = reader if reader is not None else open_gguf(path)
    gguf_arch, _ = _architecture(reader, path)
    num_heads = int(_field(reader, f"{gguf_arch}.attention.head_count"))
    num_kv_heads = int(_field(reader, f"{gguf_arch}.attention.head_count_kv") or num_heads)
    # Only llama-architecture files are permuted: llama.cpp's qwen models use neox-style rope,
    # the same half-split layout Hugging Face uses.
    permuted_heads = (
        {"self_attn.q_proj": num_heads, "self_attn.k_proj": num_kv_heads}
        if gguf_arch == "llama"
        else {}
    )
    for tensor in reader.tensors:
        try:
            name = hf_tensor_name(tensor.name)
        except KeyError:
            raise ModelLoadError(
                f"GGUF file {str(path)!r} has tensor {tensor.name!r}, which ladle cannot place"
            ) from None
        if name is None:
            continue
        if keep_native and tensor.ggml_type in NATIVE_TYPES and len(tensor.shape) == 2:
            weight = _native_rows(reader, tensor)
        else:
            weight = _dequantize(reader, tensor, torch.device(device))
        for projection, heads in permuted_heads.items():
            if f".{projection}." in name:
                if isinstance(weight, GroupQuantizedRows):
                    weight = weight.map_rows(lambda rows, h=heads: unpermute_rope_rows(rows, h))
                else:
                    weight = unpermute_rope_rows(weight, heads)
        yield name, weight


def _native_rows(reader: GGUFHeader, tensor: GGUFTensorInfo) -> GroupQuantizedRows:
    try:
        return native_group_rows(reader.tensor_bytes(tensor), tensor.ggml_type, tensor.shape)
    except (ValueError, RuntimeError) as error:
        raise ModelLoadError(
            f"GGUF file {str(reader.path)!r}: tensor {tensor.name} is corrupt ({error})"
        ) from error
