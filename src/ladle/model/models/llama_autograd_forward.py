"""The Llama-family model's forward over one sequence in plain torch ops that autograd follows.

The serving forward (llama.py) writes keys and values into a paged cache and, on the CPU, calls
C kernels that update tensors in place: neither can be differentiated. `ladle quantize
--tune-steps` (loader/scale_tuning.py) needs gradients of the logits with respect to the
quantized projections' scales and the norms, so it runs this instead: the same arithmetic on one
causal sequence, with no cache, where any module's weight may be replaced by a tensor (or a
function of the input) that carries a graph. The test holds it to the serving forward's logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ladle.model.layers.rotary import rotate_with_tables

# module name -> its weight tensor, or a function computing the module's output from its input
Overrides = dict[str, torch.Tensor | Callable[[torch.Tensor], torch.Tensor]]


def sequence_logits(
    model: nn.Module, token_ids: torch.Tensor, overrides: Overrides | None = None
) -> torch.Tensor:
    """float32 logits [T, vocab] of the causal sequence `token_ids` [T] (positions 0..T-1)."""
    _, final_hidden = sequence_hidden_states(model, token_ids, (), overrides)
    decoder = model.model
    head = decoder.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    return (final_hidden @ head.t()).float()


def sequence_hidden_states(
    model: nn.Module,
    token_ids: torch.Tensor,
    layer_ids: tuple[int, ...],
    overrides: Overrides | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(the residual stream entering each decoder layer of `layer_ids` [T, hidden], in that
    order; the final normed hidden state [T, hidden] the LM head reads) of the causal sequence
    `token_ids` [T]. The stream entering layer i is Hugging Face's hidden_states[i] and what
    vLLM's EAGLE-3 calls auxiliary layer i (i = 0 is the embedding)."""
    overrides = overrides or {}
    config, decoder = model.config, model.model

    def linear(name: str, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        override = overrides.get(name, module.weight)
        output = override(x) if callable(override) else x @ override.t()
        return output if module.bias is None else output + module.bias

    def norm(name: str, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        weight = overrides.get(name, module.weight)
        return F.rms_norm(x.float(), (x.shape[-1],), None, module.eps).to(x.dtype) * weight

    num_tokens = token_ids.shape[0]
    heads, kv_heads, head_dim = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    )
    tables = decoder.rotary_emb.step_tables(torch.arange(num_tokens, device=token_ids.device))
    x = decoder.embed_tokens.weight[token_ids]
    captured: dict[int, torch.Tensor] = {}
    for index, layer in enumerate(decoder.layers):
        if index in layer_ids:
            captured[index] = x
        prefix = f"model.layers.{index}."
        attention = layer.self_attn
        h = norm(prefix + "input_layernorm", layer.input_layernorm, x)
        qkv = linear(prefix + "self_attn.qkv_proj", attention.qkv_proj, h)
        query, key, value = attention.qkv_proj.split(qkv)
        query = query.reshape(num_tokens, heads, head_dim)
        key = key.reshape(num_tokens, kv_heads, head_dim)
        if attention.q_norm is not None:
            query = norm(prefix + "self_attn.q_norm", attention.q_norm, query)
            key = norm(prefix + "self_attn.k_norm", attention.k_norm, key)
        query, key = rotate_with_tables(query, tables), rotate_with_tables(key, tables)
        value = value.reshape(num_tokens, kv_heads, head_dim)
        attended = F.scaled_dot_product_attention(
            query.transpose(0, 1),
            key.transpose(0, 1),
            value.transpose(0, 1),
            is_causal=True,
            enable_gqa=heads != kv_heads,
        )
        attended = attended.transpose(0, 1).reshape(num_tokens, heads * head_dim)
        x = x + linear(prefix + "self_attn.o_proj", attention.o_proj, attended)
        h = norm(prefix + "post_attention_layernorm", layer.post_attention_layernorm, x)
        gate, up = linear(prefix + "mlp.gate_up_proj", layer.mlp.gate_up_proj, h).chunk(2, dim=-1)
        x = x + linear(prefix + "mlp.down_proj", layer.mlp.down_proj, F.silu(gate) * up)
    missing = [index for index in layer_ids if index not in captured]
    if missing:
        raise ValueError(f"layer ids {missing} are not decoder layers 0..{len(decoder.layers) - 1}")
    return [captured[index] for index in layer_ids], norm("model.norm", decoder.norm, x)
