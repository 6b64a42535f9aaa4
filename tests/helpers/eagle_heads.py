"""Tiny EAGLE heads with random weights, written in the checkpoint layout vLLM and SGLang load
(and `ladle train-draft` writes): config.json + model.safetensors.

save_eagle_head(root, target_dir, method="eagle3", draft_vocab_size=None, **config_overrides)
    -> the head's folder. EAGLE-3 keys: fc.weight [h, 3h], midlayer.self_attn.{q,k,v,o}_proj,
    midlayer.mlp.{gate,up,down}_proj, midlayer.{input_layernorm,hidden_norm,
    post_attention_layernorm}, norm, lm_head [draft vocab, h], d2t, t2d. EAGLE-1 keys: fc.weight
    [h, 2h], layers.0.self_attn.*, layers.0.mlp.*, layers.0.post_attention_layernorm.
    `weights` (optional dict) replaces tensors by name; `drop` leaves names out.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
EAGLE1_ARCHITECTURE = "LlamaForCausalLMEagle"


def eagle_head_tensors(
    config: dict, method: str, draft_vocab_size: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    hidden = config["hidden_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=generator) * 0.05

    def norm() -> torch.Tensor:
        return 1.0 + torch.randn(hidden, generator=generator) * 0.05

    attn_in = 2 * hidden if method == "eagle3" else hidden
    prefix = "midlayer." if method == "eagle3" else "layers.0."
    tensors = {
        f"{prefix}self_attn.q_proj.weight": rand(heads * head_dim, attn_in),
        f"{prefix}self_attn.k_proj.weight": rand(kv_heads * head_dim, attn_in),
        f"{prefix}self_attn.v_proj.weight": rand(kv_heads * head_dim, attn_in),
        f"{prefix}self_attn.o_proj.weight": rand(hidden, heads * head_dim),
        f"{prefix}mlp.gate_proj.weight": rand(inter, hidden),
        f"{prefix}mlp.up_proj.weight": rand(inter, hidden),
        f"{prefix}mlp.down_proj.weight": rand(hidden, inter),
        f"{prefix}post_attention_layernorm.weight": norm(),
    }
    if method == "eagle3":
        vocab = config["vocab_size"]
        tensors.update({
            "fc.weight": rand(hidden, 3 * hidden),
            "midlayer.input_layernorm.weight": norm(),
            "midlayer.hidden_norm.weight": norm(),
            "norm.weight": norm(),
            "lm_head.weight": rand(draft_vocab_size, hidden),
        })
        # Draft id i -> target id: every other id of the target's vocabulary, from 0.
        target_ids = torch.arange(draft_vocab_size) * max(vocab // draft_vocab_size, 1)
        tensors["d2t"] = target_ids - torch.arange(draft_vocab_size)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[target_ids] = True
        tensors["t2d"] = t2d
    else:
        tensors["fc.weight"] = rand(hidden, 2 * hidden)
    return tensors


def save_eagle_head(
    root: str | Path,
    target_dir: str | Path,
    method: str = "eagle3",
    draft_vocab_size: int | None = None,
    name: str | None = None,
    weights: dict[str, torch.Tensor] | None = None,
    drop: tuple[str, ...] = (),
    seed: int = 0,
    **config_overrides,
) -> str:
    target = json.loads((Path(target_dir) / "config.json").read_text())
    vocab = target["vocab_size"]
    draft_vocab = draft_vocab_size or vocab
    config = {
        "architectures": [EAGLE3_ARCHITECTURE if method == "eagle3" else EAGLE1_ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": target["hidden_size"],
        "intermediate_size": target["intermediate_size"],
        "num_attention_heads": target["num_attention_heads"],
        "num_key_value_heads": target["num_key_value_heads"],
        "head_dim": target.get("head_dim"),
        "num_hidden_layers": 1,
        "rms_norm_eps": target.get("rms_norm_eps", 1e-6),
        "rope_theta": target.get("rope_theta", 10000.0),
        "max_position_embeddings": target["max_position_embeddings"],
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if method == "eagle3":
        config["draft_vocab_size"] = draft_vocab
        config["target_hidden_size"] = target["hidden_size"]
    config.update(config_overrides)
    folder = Path(root) / (name or f"{method}_head_{draft_vocab}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    tensors = eagle_head_tensors(config, method, draft_vocab, seed)
    tensors.update(weights or {})
    for key in drop:
        tensors.pop(key, None)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return str(folder)


def random_trainable_head(
    seed: int,
    hidden: int,
    vocab_size: int,
    draft_vocab_size: int,
    num_heads: int,
    num_kv_heads: int,
    norm_offset: float = 0.0,
):
    """A tiny ladle.spec_decode.train Eagle3Head (head_dim 8, 1.5x MLP) over a seeded random
    draft vocabulary, every weight N(0, 0.3^2), the norms' weights `norm_offset` higher."""
    from ladle.spec_decode.train.eagle3_head import Eagle3Head, Eagle3HeadConfig

    config = Eagle3HeadConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 3 // 2,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=8,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=64,
        vocab_size=vocab_size,
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=hidden,
        aux_layer_ids=(0, 1, 2),
    )
    generator = torch.Generator().manual_seed(seed)
    draft_ids = torch.randperm(vocab_size, generator=generator)[:draft_vocab_size].sort().values
    head = Eagle3Head(config, draft_ids)
    with torch.no_grad():
        for parameter in head.parameters():
            offset = norm_offset if parameter.dim() == 1 else 0.0
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3 + offset)
    return head
