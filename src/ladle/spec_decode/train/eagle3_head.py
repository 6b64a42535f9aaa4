"""An EAGLE-3 draft head in plain torch ops that autograd follows: the module `ladle train-draft`
trains and measures, whose state dict is exactly the checkpoint vLLM and SGLang load
(`LlamaForCausalLMEagle3`; layout.py writes it).

What one draft step computes, at every position t of a batch of sequences [B, T]:

    fused    = fc(concat of the target's residual stream entering three layers)   (step 0 only)
    x        = concat(input_layernorm(embedding of the input token), hidden_norm(h))
    residual = h + o_proj(attention(q, k, v of x, rotary at the step's positions))
    prenorm  = residual + mlp(post_attention_layernorm(residual))
    logits   = lm_head(norm(prenorm))                        over the draft vocabulary

h is `fused` at step 0 and the previous step's `prenorm` after it (vLLM feeds the pre-norm
state back). Step 0's keys and values, computed with the target's features, are the context
every later step attends to causally; step j > 0 at position t also attends to the keys of
steps 1..j at that same t (its own chain). That is EAGLE-3's training-time test, and exactly
what inference sees: context positions hold the draft layer's KV from the target's features,
the chain holds the drafts' own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ladle.model.arch_config import ModelArchConfig
from ladle.model.layers.rotary import compute_inv_freq

# One step's keys and values [B, kv_heads, T, head_dim], appended step by step.
KVChain = list[tuple[torch.Tensor, torch.Tensor]]


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """vLLM's default EAGLE-3 layers (2, L // 2, L - 3): low, middle and high, clamped into
    0..L-1 for models too shallow for it (the ids may then repeat)."""
    last = num_layers - 1
    return tuple(min(max(index, 0), last) for index in (2, num_layers // 2, num_layers - 3))


@dataclass(frozen=True)
class Eagle3HeadConfig:
    """The head's shape; `to_hf_dict` is its config.json in vLLM's layout."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: tuple[int, int, int]

    @classmethod
    def from_target(
        cls,
        target: ModelArchConfig,
        draft_vocab_size: int,
        aux_layer_ids: tuple[int, int, int] | None = None,
    ) -> Eagle3HeadConfig:
        """The head of `target`'s shape (published EAGLE-3 heads copy the target's attention and
        MLP sizes), over `draft_vocab_size` of its tokens."""
        if not 1 <= draft_vocab_size <= target.vocab_size:
            raise ValueError(
                f"draft_vocab_size {draft_vocab_size} must be in 1..{target.vocab_size} (the "
                "target's vocabulary)"
            )
        ids = aux_layer_ids or default_aux_layer_ids(target.num_hidden_layers)
        if len(ids) != 3 or not all(0 <= i < target.num_hidden_layers for i in ids):
            raise ValueError(
                f"aux_layer_ids {list(ids)} must be three layer ids in "
                f"0..{target.num_hidden_layers - 1}"
            )
        return cls(
            hidden_size=target.hidden_size,
            intermediate_size=target.intermediate_size,
            num_attention_heads=target.num_attention_heads,
            num_key_value_heads=target.num_key_value_heads,
            head_dim=target.head_dim,
            rms_norm_eps=target.rms_norm_eps,
            rope_theta=target.rope_theta,
            rope_scaling=target.rope_scaling,
            max_position_embeddings=target.max_position_embeddings,
            vocab_size=target.vocab_size,
            draft_vocab_size=draft_vocab_size,
            target_hidden_size=target.hidden_size,
            aux_layer_ids=tuple(int(i) for i in ids),
        )

    def to_hf_dict(self, dtype_name: str) -> dict:
        """config.json of the head, as vLLM's Eagle3LlamaForCausalLM reads it. The aux layer
        ids are vLLM's (id i = the residual stream entering decoder layer i), written both at
        the top level (what vLLM's model runner reads) and in eagle_config."""
        ids = list(self.aux_layer_ids)
        return {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "tie_word_embeddings": False,
            "attention_bias": False,
            "torch_dtype": dtype_name,
            "eagle_aux_hidden_state_layer_ids": ids,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True},
        }

    @classmethod
    def from_hf_dict(cls, config: dict) -> Eagle3HeadConfig:
        """Read a head's config.json (the inverse of to_hf_dict)."""
        eagle = config.get("eagle_config") or {}
        ids = config.get("eagle_aux_hidden_state_layer_ids") or eagle.get(
            "eagle_aux_hidden_state_layer_ids"
        )
        heads = int(config["num_attention_heads"])
        return cls(
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            rope_scaling=config.get("rope_scaling"),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            vocab_size=int(config["vocab_size"]),
            draft_vocab_size=int(config.get("draft_vocab_size") or config["vocab_size"]),
            target_hidden_size=int(config.get("target_hidden_size") or config["hidden_size"]),
            aux_layer_ids=tuple(int(i) for i in ids) if ids else (),
        )


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, as Llama's."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype)
        return normed * self.weight


class _Attention(nn.Module):
    def __init__(self, config: Eagle3HeadConfig) -> None:
        super().__init__()
        heads, kv_heads, dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        # The input is concat(embedding, hidden): twice the hidden size.
        self.q_proj = nn.Linear(2 * config.hidden_size, heads * dim, bias=False)
        self.k_proj = nn.Linear(2 * config.hidden_size, kv_heads * dim, bias=False)
        self.v_proj = nn.Linear(2 * config.hidden_size, kv_heads * dim, bias=False)
        self.o_proj = nn.Linear(heads * dim, config.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, config: Eagle3HeadConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _MidLayer(nn.Module):
    def __init__(self, config: Eagle3HeadConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(config)
        self.mlp = _MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Eagle3Head(nn.Module):
    """The trainable head. Its state dict (parameters fc, midlayer.*, norm, lm_head and the
    buffers d2t, t2d) is the checkpoint; the target's embedding is passed in, never stored."""

    def __init__(self, config: Eagle3HeadConfig, draft_token_ids: torch.Tensor) -> None:
        """draft_token_ids: the target ids of the draft vocabulary [draft_vocab_size],
        ascending (draft id i is target id draft_token_ids[i])."""
        super().__init__()
        if draft_token_ids.shape != (config.draft_vocab_size,):
            raise ValueError(
                f"draft_token_ids has shape {tuple(draft_token_ids.shape)}; the config's "
                f"draft_vocab_size is {config.draft_vocab_size}"
            )
        self.config = config
        self.fc = nn.Linear(3 * config.target_hidden_size, config.hidden_size, bias=False)
        self.midlayer = _MidLayer(config)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        ids = draft_token_ids.to(torch.long)
        # vLLM's d2t: target id = draft id + d2t[draft id]; t2d: which target ids are drafted.
        self.register_buffer("d2t", ids - torch.arange(len(ids), device=ids.device))
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool, device=ids.device)
        t2d[ids] = True
        self.register_buffer("t2d", t2d)
        inv_freq = compute_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    @property
    def draft_token_ids(self) -> torch.Tensor:
        """Target id of each draft id [draft_vocab_size]."""
        return self.d2t + torch.arange(len(self.d2t), device=self.d2t.device)

    def fuse(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """fc over the target's three layers' states concatenated [..., 3 * target_hidden]."""
        return self.fc(aux_hidden.to(self.fc.weight.dtype))

    def step(
        self,
        token_embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        chain: KVChain,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step over [B, T]: token_embeds and hidden [B, T, hidden], positions [T]
        (the step's rotary positions). `chain` holds the earlier steps' keys and values and
        gets this step's; with an empty chain this is step 0 (causal over the sequence).
        Returns (logits [B, T, draft_vocab] of the next token, the pre-norm state for the next
        step)."""
        layer = self.midlayer
        attention = layer.self_attn
        config = self.config
        batch, length, _ = hidden.shape
        heads, kv_heads, dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        x = torch.cat(
            (layer.input_layernorm(token_embeds.to(hidden.dtype)), layer.hidden_norm(hidden)),
            dim=-1,
        )
        query = attention.q_proj(x).view(batch, length, heads, dim).transpose(1, 2)
        key = attention.k_proj(x).view(batch, length, kv_heads, dim).transpose(1, 2)
        value = attention.v_proj(x).view(batch, length, kv_heads, dim).transpose(1, 2)
        query, key = self._rotate(query, positions), self._rotate(key, positions)
        chain.append((key, value))
        attended = _chain_attention(query, chain, heads // kv_heads)
        attended = attended.transpose(1, 2).reshape(batch, length, heads * dim)
        residual = hidden + attention.o_proj(attended)
        prenorm = residual + layer.mlp(layer.post_attention_layernorm(residual))
        return self.lm_head(self.norm(prenorm)), prenorm

    def _rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Neox rotary on x [B, heads, T, head_dim] at positions [T], in float32."""
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos(), angles.sin()
        x1, x2 = x.float().chunk(2, dim=-1)
        rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        return rotated.to(x.dtype)


def _chain_attention(query: torch.Tensor, chain: KVChain, group: int) -> torch.Tensor:
    """query [B, H, T, d] attends causally to chain[0]'s keys (step 0: the context) and, at each
    t, to the keys of chain[1:] at that same t (the query's own earlier drafts)."""
    context_key, context_value = chain[0]
    if len(chain) == 1:
        return F.scaled_dot_product_attention(
            query, context_key, context_value, is_causal=True, enable_gqa=group > 1
        )
    scale = query.shape[-1] ** -0.5
    expand = (lambda t: t.repeat_interleave(group, dim=1)) if group > 1 else (lambda t: t)
    length = query.shape[2]
    scores = (query @ expand(context_key).transpose(-1, -2)) * scale
    future = torch.ones(length, length, dtype=torch.bool, device=query.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    own = [(query * expand(key)).sum(-1, keepdim=True) * scale for key, _ in chain[1:]]
    weights = torch.softmax(torch.cat([scores, *own], dim=-1).float(), dim=-1).to(query.dtype)
    attended = weights[..., :length] @ expand(context_value)
    for index, (_, value) in enumerate(chain[1:]):
        attended = attended + weights[..., length + index, None] * expand(value)
    return attended
