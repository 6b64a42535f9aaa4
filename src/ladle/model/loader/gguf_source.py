"""A GGUF file as the float source of `ladle quantize`: its tensors dequantized to float32 under
their Hugging Face names (gguf.py's iter_gguf_weights), a config.json built from its header, and
its tokenizer saved in the Hugging Face format, so the quantized folder needs no other files.

This is how the default model (shipped only as a Q4_1 GGUF) gets GPTQ/AWQ/fp8 checkpoints; the
float32 weights it starts from are the GGUF's own dequantized values (docs/quantization.md says
what re-quantizing them costs).
"""

from __future__ import annotations

import os
from pathlib import Path

from ladle.model.tokenizer import load_tokenizer

MODEL_TYPES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


def is_gguf_file(path: str | os.PathLike) -> bool:
    path = Path(path)
    return path.is_file() and path.suffix.lower() == ".gguf"


def gguf_hf_config(path: str | os.PathLike) -> dict:
    """A Hugging Face config.json dict that ladle reads back to the GGUF's model shape."""
    from ladle.model.loader.gguf import read_gguf_arch_config

    arch = read_gguf_arch_config(path)
    eos = list(arch.eos_token_ids)
    config = {
        "architectures": [arch.architecture],
        "model_type": MODEL_TYPES[arch.architecture],
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_hidden_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "rms_norm_eps": arch.rms_norm_eps,
        "rope_theta": arch.rope_theta,
        "rope_scaling": arch.rope_scaling,
        "max_position_embeddings": arch.max_position_embeddings,
        "tie_word_embeddings": arch.tie_word_embeddings,
        "attention_bias": arch.attention_bias,
        "bos_token_id": arch.bos_token_id,
        "eos_token_id": eos[0] if len(eos) == 1 else eos,
        "hidden_act": "silu",
    }
    return config


def save_gguf_tokenizer(path: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Write the GGUF's tokenizer (as transformers converts it) into out_dir."""
    load_tokenizer(str(path)).hf_tokenizer.save_pretrained(str(out_dir))
