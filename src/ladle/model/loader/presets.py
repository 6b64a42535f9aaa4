"""Named model shapes for load_format='dummy': the real config.json values of public checkpoints,
so benchmarks and memory sizing can run a model's exact shape with random weights and no download.
"""

from __future__ import annotations

import copy


def _llama(**values: object) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **values}


def _qwen3(**values: object) -> dict:
    base = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151936,
        "head_dim": 128,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "attention_bias": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    }
    return {**base, **values}


def _qwen3_moe(**values: object) -> dict:
    base = _qwen3(
        architectures=["Qwen3MoeForCausalLM"],
        model_type="qwen3_moe",
        num_key_value_heads=4,
        tie_word_embeddings=False,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    )
    return {**base, **values}


_LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}

def _llama31(**values: object) -> dict:
    """Llama 3.1's shared fields (vocabulary, grouped-query attention of 8 key/value heads of
    128, rope scaling, context); `values` give the size."""
    base = _llama(
        vocab_size=128256,
        num_key_value_heads=8,
        head_dim=128,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=dict(_LLAMA3_ROPE_SCALING),
        max_position_embeddings=131072,
        tie_word_embeddings=False,
        bos_token_id=128000,
        eos_token_id=128001,
    )
    return {**base, **values}


# Preset name -> Hugging Face config.json dict (only the fields ModelArchConfig reads).
PRESETS: dict[str, dict] = {
    "qwen3-0.6b": _qwen3(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        tie_word_embeddings=True,
    ),
    "qwen3-1.7b": _qwen3(
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=28,
        num_attention_heads=16,
        tie_word_embeddings=True,
    ),
    "qwen3-4b": _qwen3(
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        tie_word_embeddings=True,
    ),
    "qwen3-8b": _qwen3(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        tie_word_embeddings=False,
    ),
    "qwen2.5-0.5b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "bos_token_id": 151643,
        "eos_token_id": 151643,
    },
    "llama-3.1-8b": _llama31(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32
    ),
    # Llama-3.1-70B (and 3.3-70B, the same shape): 141 GB in bf16, the tensor-parallel targets.
    "llama-3.1-70b": _llama31(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64
    ),
    "llama-3.2-1b": _llama(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling={**_LLAMA3_ROPE_SCALING, "factor": 32.0},
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        bos_token_id=128000,
        eos_token_id=128001,
    ),
    "llama-2-7b": _llama(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    ),
    # SmolLM2-135M-Instruct (the embedded default model): bos <|im_start|>, eos <|im_end|>.
    "smollm2-135m": _llama(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    ),
    # Mixtures of experts. intermediate_size is the (unused here) dense MLP width of
    # mlp_only_layers; each of the 128 experts is moe_intermediate_size wide, 8 run per token.
    "qwen3-30b-a3b": _qwen3_moe(
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
    ),
    "qwen3-235b-a22b": _qwen3_moe(
        hidden_size=4096,
        intermediate_size=12288,
        moe_intermediate_size=1536,
        num_hidden_layers=94,
        num_attention_heads=64,
    ),
    # Mixtral-8x7B-v0.1: 8 experts of intermediate_size, 2 per token, no sliding window.
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    # A few-megabyte model for fast engine tests that need no real weights.
    "tiny-llama": _llama(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    ),
    # tiny-llama's shape with 8 experts of width 32, 2 per token: fast MoE engine tests.
    "tiny-qwen3-moe": _qwen3_moe(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_experts=8,
        num_experts_per_tok=2,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
    ),
    "tiny-mixtral": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}


def get_preset(name: str) -> dict | None:
    """A fresh copy of the preset's config dict (callers merge overrides into it), or None."""
    preset = PRESETS.get(name.lower())
    return copy.deepcopy(preset) if preset is not None else None
