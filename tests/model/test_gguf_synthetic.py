"""GGUF reading on small files written here: name mapping, the llama q/k un-permutation, every
dequantized type, llama3 rope-scaling recovery and the errors. Fast and offline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from ladle.model.arch_config import UnsupportedModelError
from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.gguf import (
    UnsupportedGGUFError,
    iter_gguf_weights,
    llama3_rope_factors,
    read_gguf_arch_config,
)

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 32, 4, 2, 8, 64, 48


def llama_cpp_permute(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to llama q/k rows (written from its documented layout)."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, 2, rows // num_heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf(
    path: Path,
    arch: str,
    tensors: dict[str, np.ndarray | tuple[np.ndarray, GGMLQuantizationType]],
    metadata: dict | None = None,
    qtypes: dict[str, GGMLQuantizationType] | None = None,
) -> Path:
    writer = GGUFWriter(path, arch)
    values = {
        f"{arch}.block_count": 1,
        f"{arch}.context_length": 256,
        f"{arch}.embedding_length": HIDDEN,
        f"{arch}.feed_forward_length": FFN,
        f"{arch}.attention.head_count": HEADS,
        f"{arch}.attention.head_count_kv": KV_HEADS,
        f"{arch}.rope.freq_base": 10000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        **(metadata or {}),
    }
    for key, value in values.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    for name, array in tensors.items():
        qtype = (qtypes or {}).get(name)
        if isinstance(array, tuple):  # (raw block bytes, their type), written as they are
            writer.add_tensor(name, array[0], raw_dtype=array[1])
        elif qtype is None:
            writer.add_tensor(name, array)
        else:
            writer.add_tensor(name, quantize(array, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def hf_weights(seed: int = 0, bias: bool = False, qk_norm: bool = False, untied: bool = False):
    """Random weights under Hugging Face names, with their GGUF names."""
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    weights = {
        "token_embd.weight": ("model.embed_tokens.weight", rand(VOCAB, HIDDEN)),
        "output_norm.weight": ("model.norm.weight", rand(HIDDEN)),
        "blk.0.attn_norm.weight": ("model.layers.0.input_layernorm.weight", rand(HIDDEN)),
        "blk.0.ffn_norm.weight": ("model.layers.0.post_attention_layernorm.weight", rand(HIDDEN)),
        "blk.0.attn_q.weight": ("model.layers.0.self_attn.q_proj.weight", rand(HIDDEN, HIDDEN)),
        "blk.0.attn_k.weight": (
            "model.layers.0.self_attn.k_proj.weight",
            rand(KV_HEADS * HEAD_DIM, HIDDEN),
        ),
        "blk.0.attn_v.weight": (
            "model.layers.0.self_attn.v_proj.weight",
            rand(KV_HEADS * HEAD_DIM, HIDDEN),
        ),
        "blk.0.attn_output.weight": (
            "model.layers.0.self_attn.o_proj.weight",
            rand(HIDDEN, HIDDEN),
        ),
        "blk.0.ffn_gate.weight": ("model.layers.0.mlp.gate_proj.weight", rand(FFN, HIDDEN)),
        "blk.0.ffn_up.weight": ("model.layers.0.mlp.up_proj.weight", rand(FFN, HIDDEN)),
        "blk.0.ffn_down.weight": ("model.layers.0.mlp.down_proj.weight", rand(HIDDEN, FFN)),
    }
    if bias:
        weights["blk.0.attn_q.bias"] = ("model.layers.0.self_attn.q_proj.bias", rand(HIDDEN))
        weights["blk.0.attn_k.bias"] = (
            "model.layers.0.self_attn.k_proj.bias",
            rand(KV_HEADS * HEAD_DIM),
        )
        weights["blk.0.attn_v.bias"] = (
            "model.layers.0.self_attn.v_proj.bias",
            rand(KV_HEADS * HEAD_DIM),
        )
    if qk_norm:
        weights["blk.0.attn_q_norm.weight"] = ("model.layers.0.self_attn.q_norm.weight", rand(8))
        weights["blk.0.attn_k_norm.weight"] = ("model.layers.0.self_attn.k_norm.weight", rand(8))
    if untied:
        weights["output.weight"] = ("lm_head.weight", rand(VOCAB, HIDDEN))
    return weights


def test_llama_names_and_qk_unpermute(tmp_path: Path) -> None:
    weights = hf_weights(bias=True)
    on_disk = {name: array for name, (_, array) in weights.items()}
    for name, heads in (("attn_q", HEADS), ("attn_k", KV_HEADS)):
        for kind in ("weight", "bias"):
            key = f"blk.0.{name}.{kind}"
            on_disk[key] = llama_cpp_permute(on_disk[key], heads)
    path = write_gguf(tmp_path / "llama.gguf", "llama", on_disk)
    loaded = dict(iter_gguf_weights(path))
    expected = {hf_name: array for hf_name, array in weights.values()}
    assert loaded.keys() == expected.keys()
    for name, tensor in loaded.items():
        assert tensor.dtype == torch.float32
        torch.testing.assert_close(tensor, torch.from_numpy(expected[name]), rtol=0, atol=0)
    config = read_gguf_arch_config(path)
    assert config.architecture == "LlamaForCausalLM"
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 8)
    assert config.vocab_size == VOCAB  # no token list: from the embedding matrix
    assert config.tie_word_embeddings and config.attention_bias and not config.qk_norm
    assert config.bos_token_id == 1 and config.eos_token_ids == (2,)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_is_not_permuted(tmp_path: Path, arch: str) -> None:
    weights = hf_weights(bias=arch == "qwen2", qk_norm=arch == "qwen3", untied=True)
    path = write_gguf(
        tmp_path / f"{arch}.gguf",
        arch,
        {name: array for name, (_, array) in weights.items()},
        metadata={"tokenizer.ggml.eot_token_id": 7},
    )
    loaded = dict(iter_gguf_weights(path))
    for hf_name, array in weights.values():
        torch.testing.assert_close(loaded[hf_name], torch.from_numpy(array), rtol=0, atol=0)
    config = read_gguf_arch_config(path)
    assert config.architecture == {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]
    assert not config.tie_word_embeddings and "lm_head.weight" in loaded
    assert config.attention_bias == (arch == "qwen2")
    assert config.qk_norm == (arch == "qwen3")
    assert config.eos_token_ids == (2, 7)  # eos, then llama.cpp's end of turn


@pytest.mark.parametrize(
    "qtype, atol",
    [
        (GGMLQuantizationType.F16, 1e-3),
        (GGMLQuantizationType.BF16, 2e-2),
        (GGMLQuantizationType.Q8_0, 3e-2),
        (GGMLQuantizationType.Q4_0, 0.5),
        (GGMLQuantizationType.Q4_1, 0.5),
        (GGMLQuantizationType.Q5_0, 0.3),
    ],
)
def test_quantized_types_dequantize(
    tmp_path: Path, qtype: GGMLQuantizationType, atol: float
) -> None:
    weights = hf_weights(seed=1)
    on_disk = {name: array for name, (_, array) in weights.items()}
    name = "blk.0.ffn_up.weight"
    qtypes = {name: qtype}
    if qtype in (GGMLQuantizationType.F16,):
        on_disk[name] = on_disk[name].astype(np.float16)
        qtypes = {}
    path = write_gguf(tmp_path / "q.gguf", "qwen3", on_disk, qtypes=qtypes)
    loaded = dict(iter_gguf_weights(path))["model.layers.0.mlp.up_proj.weight"]
    original = weights[name][1]
    assert loaded.shape == original.shape and loaded.dtype == torch.float32
    torch.testing.assert_close(loaded, torch.from_numpy(original), rtol=0, atol=atol)


@pytest.mark.parametrize("qtype", [GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K])
def test_k_quants_dequantize(tmp_path: Path, qtype: GGMLQuantizationType) -> None:
    # The gguf package cannot quantize K-quants, so write raw blocks with small, finite scales
    # and compare with its own dequantization.
    from gguf.constants import GGML_QUANT_SIZES

    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rows, cols = 4, 2 * block_size
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=(rows, cols // block_size * type_size), dtype=np.uint8)
    # Each block's fp16 scale(s): Q4_K starts with d, dmin; Q6_K ends with d.
    scale = np.array([0.01], dtype=np.float16).view(np.uint8)
    for block in range(cols // block_size):
        start = block * type_size
        offsets = (0, 2) if qtype == GGMLQuantizationType.Q4_K else (type_size - 2,)
        for offset in offsets:
            raw[:, start + offset : start + offset + 2] = scale
    on_disk = {name: array for name, (_, array) in hf_weights(seed=2).items()}
    on_disk["blk.0.ffn_down.weight"] = (raw, qtype)
    path = write_gguf(tmp_path / "k.gguf", "qwen3", on_disk)
    loaded = dict(iter_gguf_weights(path))["model.layers.0.mlp.down_proj.weight"]
    assert loaded.shape == (rows, cols)
    expected = torch.from_numpy(dequantize(raw, qtype).astype(np.float32))
    torch.testing.assert_close(loaded, expected, rtol=0, atol=0)
    assert torch.isfinite(loaded).all()


def test_llama3_rope_scaling_is_recovered(tmp_path: Path) -> None:
    scaling = {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    theta = 500000.0
    factors = llama3_rope_factors(scaling, theta, HEAD_DIM * 8).astype(np.float32)
    weights = hf_weights()
    on_disk = {name: array for name, (_, array) in weights.items()}
    on_disk["rope_freqs.weight"] = factors
    path = write_gguf(
        tmp_path / "llama3.gguf",
        "llama",
        on_disk,
        metadata={"llama.rope.freq_base": theta, "llama.attention.key_length": HEAD_DIM * 8},
    )
    config = read_gguf_arch_config(path)
    assert config.rope_scaling == scaling
    assert "rope_freqs.weight" not in dict(iter_gguf_weights(path))


def test_unsupported_architecture_names_the_file(tmp_path: Path) -> None:
    path = write_gguf(
        tmp_path / "gpt2.gguf", "gpt2", {"token_embd.weight": np.zeros((4, 4), np.float32)}
    )
    with pytest.raises(UnsupportedGGUFError, match="gpt2.gguf.*'gpt2'"):
        read_gguf_arch_config(path)
    with pytest.raises(ModelLoadError):
        list(iter_gguf_weights(path))
    # Callers may catch either family.
    assert issubclass(UnsupportedGGUFError, UnsupportedModelError)


def test_unknown_tensor_is_an_error(tmp_path: Path) -> None:
    weights = hf_weights()
    on_disk = {name: array for name, (_, array) in weights.items()}
    on_disk["blk.0.mystery.weight"] = np.zeros(4, np.float32)
    path = write_gguf(tmp_path / "odd.gguf", "llama", on_disk)
    with pytest.raises(ModelLoadError, match="blk.0.mystery.weight"):
        list(iter_gguf_weights(path))


def test_missing_and_non_gguf_files(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="nothing.gguf.*does not exist"):
        read_gguf_arch_config(tmp_path / "nothing.gguf")
    text = tmp_path / "notes.gguf"
    text.write_text("this is not a gguf file at all, just text")
    with pytest.raises(ModelLoadError, match="notes.gguf.*truncated or corrupt"):
        read_gguf_arch_config(text)
