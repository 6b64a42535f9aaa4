"""Attention of long fresh prompts through torch's SDPA (cuDNN's Hopper kernel first).

A prompt with no cached context attends only over this step's own keys and values, which sit
contiguous in the step's key/value tensors: no page gathering is needed, and cuDNN's fused
attention (warp-specialised, TMA-fed) runs such a causal prefill 1.6-1.7x faster than the paged
Triton kernel on an H100 (docs/kernels.md, "Prefill attention against cuDNN"). One SDPA call
must cover the step's prompts: one prompt, or prompts of one length batched (measured on an
H100: one call per prompt of 4 x 2048 cost 509 us against the paged kernel's 247, each call
paying ~90 us of host work with the GPU idle). Other steps keep the single paged launch, and so
does every graph template (a captured step must hold for any layout of its bucket).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ladle.attention.metadata import AttentionMetadata

# Below this many tokens a prompt's attention is a small part of its step.
MIN_FRESH_TOKENS = 512
# At most this many prompts of one length in one batched call.
MAX_FRESH_PROMPTS = 8


def fresh_prompt_spans(
    metadata: AttentionMetadata, first_request: int
) -> list[tuple[int, int]] | None:
    """The (start, end) token rows of requests first_request.. when every one of them is a
    whole prompt with no cached context of at least MIN_FRESH_TOKENS tokens, all of one length,
    and there are at most MAX_FRESH_PROMPTS; None otherwise, and always for a graph's template
    metadata (host values only, no sync). The spans are consecutive rows."""
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
    if len({end - start for start, end in spans}) > 1:
        return None  # one SDPA call per prompt would cost more than it saves (module doc)
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
    """Causal attention of each span's queries over the same span's keys and values; the spans
    are consecutive and of one length (fresh_prompt_spans), so one batched call covers them."""
    first, last = spans[0][0], spans[-1][1]
    num_prompts, length = len(spans), spans[0][1] - spans[0][0]

    def batched(rows: torch.Tensor) -> torch.Tensor:  # [prompts, heads, length, head_dim]
        return rows[first:last].view(num_prompts, length, *rows.shape[1:]).transpose(1, 2)

    group = query.shape[1] // key.shape[1]
    with _backend_order():
        attended = F.scaled_dot_product_attention(
            batched(query),
            batched(key),
            batched(value),
            is_causal=True,
            scale=scale,
            enable_gqa=group > 1,
        )
    output[first:last].view(num_prompts, length, *output.shape[1:]).copy_(attended.transpose(1, 2))
