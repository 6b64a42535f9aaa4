"""Attention of one long fresh prompt through torch's SDPA (cuDNN's Hopper kernel first).

A prompt with no cached context attends only over this step's own keys and values, which sit
contiguous in the step's key/value tensors: no page gathering is needed, and cuDNN's fused
attention (warp-specialised, TMA-fed) runs such a causal prefill 1.5-1.7x faster than the paged
Triton kernel on an H100 (docs/kernels.md, "Prefill attention against cuDNN"). Measured through
this path (scripts/fresh_prefill_bench.py): one 8192-token prompt 1.08x cuDNN alone, against
1.57x for the paged kernel. Several prompts stay on the paged launch: one SDPA call per prompt
cost 2.1x the paged kernel (4 x 2048; ~90 us of host work per call with the GPU idle), and
one batched call of equal-length prompts 2.05x cuDNN on the Qwen3-0.6B heads (1.22x on the
Llama-3.1-8B's), not reliably better than the paged kernel's 1.6x. Every graph template keeps
the paged launch too (a captured step must hold for any layout of its bucket).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ladle.attention.metadata import AttentionMetadata

# Below this many tokens a prompt's attention is a small part of its step.
MIN_FRESH_TOKENS = 512


def fresh_prompt_span(metadata: AttentionMetadata, first_request: int) -> tuple[int, int] | None:
    """The (start, end) token rows of request first_request when it is the step's last request
    and a whole prompt with no cached context of at least MIN_FRESH_TOKENS tokens; None
    otherwise, and always for a step that takes a prefill graph's launches (host values only, no
    sync)."""
    if metadata.num_reqs - first_request != 1 or metadata.graph_launches:
        return None
    start, end = metadata.query_start_loc_host[first_request : first_request + 2]
    if end - start < MIN_FRESH_TOKENS or metadata.seq_lens_host[first_request] != end - start:
        return None
    return start, end


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


def attend_fresh_prompt(
    query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,
    output: torch.Tensor,  # [num_tokens, num_heads, head_dim], written at the span's rows
    span: tuple[int, int],
    scale: float,
) -> None:
    """Causal attention of the span's queries over the same span's keys and values."""
    start, end = span

    def heads_first(rows: torch.Tensor) -> torch.Tensor:  # [1, heads, length, head_dim]
        return rows[start:end].transpose(0, 1).unsqueeze(0)

    group = query.shape[1] // key.shape[1]
    with _backend_order():
        attended = F.scaled_dot_product_attention(
            heads_first(query),
            heads_first(key),
            heads_first(value),
            is_causal=True,
            scale=scale,
            enable_gqa=group > 1,
        )
    output[start:end].copy_(attended[0].transpose(0, 1))
