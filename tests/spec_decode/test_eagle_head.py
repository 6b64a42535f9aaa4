"""The EAGLE heads' forward against a plain torch reference written from the checkpoint layout
(vLLM's / SGLang's): fc, the one decoder layer (EAGLE-3: 2h-wide attention input of the normed
embedding and normed feature; EAGLE-1: no input norm), causal attention with rotary, the final
norm, the draft-vocabulary LM head and d2t, on random inputs over a paged cache; and the target
forward's aux hidden states (EAGLE-3's feature layers) against the layer inputs."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from helpers.eagle_heads import save_eagle_head
from safetensors.torch import load_file

from ladle.attention.backend import get_attention_backend
from ladle.attention.metadata import AttentionMetadata
from ladle.model.arch_config import ModelArchConfig
from ladle.model.loader.draft_loading import _build_head
from ladle.model.loader.safetensors import iter_safetensors_weights, read_hf_config
from ladle.model.models.eagle_config import read_eagle_config


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """HF Llama's rotary (halves rotated), x [n, heads, head_dim]."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / theta ** (torch.arange(0, half, dtype=torch.float32) / half)
    angles = positions[:, None].float() * inv_freq[None]
    cos = torch.cat([angles.cos()] * 2, -1)[:, None]
    sin = torch.cat([angles.sin()] * 2, -1)[:, None]
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def _reference(tensors, config, method, input_ids, features, embedding, target_logits):
    """One sequence from position 0: (draft ids as target ids, output, feature fed back)."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config["head_dim"]
    prefix = "midlayer." if method == "eagle3" else "layers.0."
    embeds = embedding[input_ids]
    if method == "eagle3":
        feature = features @ tensors["fc.weight"].T
        residual = feature
        x = torch.cat([_rms(embeds, tensors[f"{prefix}input_layernorm.weight"]),
                       _rms(feature, tensors[f"{prefix}hidden_norm.weight"])], -1)
    else:
        x = torch.cat([embeds, features], -1) @ tensors["fc.weight"].T
        residual = x
    n = x.shape[0]
    positions = torch.arange(n)
    q = (x @ tensors[f"{prefix}self_attn.q_proj.weight"].T).view(n, heads, head_dim)
    k = (x @ tensors[f"{prefix}self_attn.k_proj.weight"].T).view(n, kv_heads, head_dim)
    v = (x @ tensors[f"{prefix}self_attn.v_proj.weight"].T).view(n, kv_heads, head_dim)
    q, k = _rotate(q, positions, config["rope_theta"]), _rotate(k, positions, config["rope_theta"])
    group = heads // kv_heads
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    attention = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
    ).transpose(0, 1).reshape(n, heads * head_dim)
    x = attention @ tensors[f"{prefix}self_attn.o_proj.weight"].T
    residual = residual + x
    x = _rms(residual, tensors[f"{prefix}post_attention_layernorm.weight"])
    gate = x @ tensors[f"{prefix}mlp.gate_proj.weight"].T
    up = x @ tensors[f"{prefix}mlp.up_proj.weight"].T
    x = (F.silu(gate) * up) @ tensors[f"{prefix}mlp.down_proj.weight"].T
    summed = x + residual
    if method == "eagle3":
        output = _rms(summed, tensors["norm.weight"])
        draft = (output @ tensors["lm_head.weight"].T).argmax(-1)
        return draft + tensors["d2t"][draft], output, summed
    return target_logits(summed).argmax(-1), summed, summed


def _check_head(tiny_model_path, tmp_path, method, draft_vocab_size=None):
    torch.manual_seed(0)
    target_dir = tiny_model_path("llama")
    target = ModelArchConfig.from_hf_dict(read_hf_config(target_dir))
    folder = save_eagle_head(tmp_path, target_dir, method, draft_vocab_size=draft_vocab_size)
    config = read_hf_config(folder)
    tensors = load_file(f"{folder}/model.safetensors")
    head_config = read_eagle_config(folder, method, target)
    backend = get_attention_backend(torch.device("cpu"))
    head = _build_head(head_config, torch.device("cpu"), torch.float32, backend)
    head.load_weights(iter_safetensors_weights([f"{folder}/model.safetensors"]))
    embedding = torch.randn(target.vocab_size, target.hidden_size)
    lm_head = torch.randn(target.vocab_size, target.hidden_size)
    head.share_target(lambda ids: embedding[ids.long()], lambda h: h @ lm_head.T)

    n, block_size = 11, 4
    input_ids = torch.randint(0, target.vocab_size, (n,))
    width = 3 * target.hidden_size if method == "eagle3" else target.hidden_size
    features = torch.randn(n, width)
    kv_cache = torch.zeros(2, 8, block_size, target.num_key_value_heads, target.head_dim)
    metadata = AttentionMetadata.one_fresh_prompt(n, block_size)
    output, fed_back = head(
        input_ids, torch.arange(n), head.combine_features(features), kv_cache, metadata
    )
    expected_ids, expected_output, expected_fed_back = _reference(
        tensors, config, method, input_ids, features, embedding, lambda h: h @ lm_head.T
    )
    torch.testing.assert_close(output, expected_output, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fed_back, expected_fed_back, atol=1e-4, rtol=1e-4)
    assert torch.equal(head.draft_ids(output), expected_ids)


def test_eagle3_head_matches_the_reference(tiny_model_path, tmp_path):
    _check_head(tiny_model_path, tmp_path, "eagle3", draft_vocab_size=128)


def test_eagle3_head_with_the_full_vocabulary(tiny_model_path, tmp_path):
    _check_head(tiny_model_path, tmp_path, "eagle3")


def test_eagle1_head_matches_the_reference(tiny_model_path, tmp_path):
    _check_head(tiny_model_path, tmp_path, "eagle")


def test_target_forward_appends_the_aux_layers_inputs(tiny_model_path):
    """With aux layers set, the target's forward returns its final hidden states unchanged,
    then each aux layer's input (hidden + residual: the previous layer's output stream)."""
    from ladle import LLM

    llm = LLM(tiny_model_path("llama"), cpu_kv_cache_gib=0.01, block_size=4)
    model = llm.engine.executor.worker.model
    n = 9
    ids = torch.randint(0, 500, (n,))
    caches = [torch.zeros(2, 8, 4, 2, 16) for _ in range(2)]
    metadata = AttentionMetadata.one_fresh_prompt(n, 4)
    plain = model(ids, torch.arange(n), caches, metadata)
    captured = []
    hooks = [
        layer.register_forward_pre_hook(
            lambda module, args: captured.append(args[1] + args[2] if args[2] is not None
                                                 else args[1])
        )
        for layer in model.model.layers
    ]
    model.model.aux_hidden_layers = (1, 1, 0)
    try:
        widened = model(ids, torch.arange(n), caches, AttentionMetadata.one_fresh_prompt(n, 4))
    finally:
        model.model.aux_hidden_layers = ()
        for hook in hooks:
            hook.remove()
    hidden = plain.shape[1]
    assert widened.shape == (n, 4 * hidden)
    torch.testing.assert_close(widened[:, :hidden], plain)
    torch.testing.assert_close(widened[:, hidden : 2 * hidden], captured[1])
    torch.testing.assert_close(widened[:, 2 * hidden : 3 * hidden], captured[1])
    torch.testing.assert_close(widened[:, 3 * hidden :], captured[0])
