"""Attention of long fresh prompts through torch's SDPA (cuDNN's Hopper kernel first).

A prompt with no cached context attends only over this step's own keys and values, which sit
contiguous in the step's key/value tensors: no page gathering is needed, and cuDNN's fused
attention (warp-specialised, TMA-fed) runs such a causal prefill 1.6-1.7x faster than the paged
Triton kernel on an H100 (docs/kernels.md, "Prefill attention against cuDNN"). One SDPA call per
prompt, so it pays only for a few long prompts: a step of many short ones keeps the single paged
launch (its host cost grows with the request count). Never inside a CUDA graph capture: a
captured step must hold for any layout of its bucket, which only the paged launch does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ladle.attention.metadata import AttentionMetadata

# Below this many tokens a prompt's attention is a small part of its step.
MIN_FRESH_TOKENS = 512
# Above this many prompts in one step, one launch per prompt costs the host more than it saves.
MAX_FRESH_PROMPTS = 8


def fresh_prompt_spans(
    metadata: AttentionMetadata, first_request: int
) -> list[tuple[int, int]] | None:
    """The (start, end) token rows of requests first_request.. when every one of them is a
    whole prompt with no cached context of at least MIN_FRESH_TOKENS tokens, and there are at
    most MAX_FRESH_PROMPTS; None otherwise, and always for a graph's template metadata (host
    values only, no sync)."""
    num_prompts = metadata.num_reqs - first_request
    if not 0 < num_prompts <= MAX_FRESH_PROMPTS or metadata.for_graph:
        return None
    starts, seq_lens = metadata.query_start_loc_host, metadata.seq_lens_host
    spans = []
    for index in range(first_request, metadata.num_reqs):
        start, end = starts[index], starts[index + 1]
        if end - start < MIN_FRESH_TOKENS or seq_lens[index] != end - start:
            return None
        spans.append((start, end))
    return spans


def _backend_order():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    ]
    try:
        return sdpa_kernel(order, set_priority=True)
    except TypeError:  # a torch without priorities: its own order among these
        return sdpa_kernel(order)


def attend_fresh_prompts(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,
    output: torch.Tensor,  # [num_tokens, num_heads, head_dim], written at the spans' rows
    spans: list[tuple[int, int]],
    scale: float,
) -> None:
    """Causal attention of each span's queries over the same span's keys and values."""
    group = query.shape[1] // key.shape[1]
    with _backend_order():
        for start, end in spans:
            q = query[start:end].transpose(0, 1).unsqueeze(0)
            k = key[start:end].transpose(0, 1).unsqueeze(0)
            v = value[start:end].transpose(0, 1).unsqueeze(0)
            attended = F.scaled_dot_product_attention(
                q, k, v, is_causal=True, scale=scale, enable_gqa=group > 1
            )
            output[start:end].copy_(attended[0].transpose(0, 1))
