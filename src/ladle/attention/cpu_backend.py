"""Batched paged attention for the CPU: every decode row of a step in one gather and one SDPA call.

The reference backend (torch_backend.py) loops over requests, which at 32 concurrent decodes and
30 layers is ~1000 small SDPA calls per step, and Python overhead dominates. Here the decode rows
(query length 1, the bulk of a serving step) are attended together: their blocks are gathered
into one [num_decodes, max_context, kv_heads, head_dim] tensor, positions past each request's
context are masked, and one grouped-query SDPA call does the rest. Prefill chunks (few per step,
each long) still go through the reference path one request at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ladle.attention.backend import KVScales
from ladle.attention.metadata import AttentionMetadata
from ladle.attention.torch_backend import TorchAttentionBackend, attend_one_request, gather_cached


class CpuAttentionBackend(TorchAttentionBackend):
    """The CPU default: batched decode attention plus the reference path for prefill chunks."""

    name = "cpu"

    @staticmethod
    def attend(
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:
        return batched_paged_attention(query, kv_cache, metadata, scale, kv_scales)


def batched_paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    kv_scales: KVScales | None = None,
) -> torch.Tensor:
    """Attention of every query row over its request's cached context (same result as
    `paged_attention_reference`), decode rows batched into one call."""
    starts = metadata.query_start_loc_host
    query_lens = [starts[i + 1] - starts[i] for i in range(metadata.num_reqs)]
    decode_reqs = [i for i, n in enumerate(query_lens) if n == 1]
    if len(decode_reqs) == len(query_lens):
        # The common serving step: every row a decode, query row i belongs to request i.
        return decode_attention(
            query, kv_cache, metadata, list(range(len(query_lens))), scale, kv_scales
        )
    output = torch.empty_like(query)
    if len(decode_reqs) > 1:
        rows = torch.tensor([starts[i] for i in decode_reqs], dtype=torch.long)
        output[rows] = decode_attention(
            query[rows], kv_cache, metadata, decode_reqs, scale, kv_scales
        )
        handled = set(decode_reqs)
    else:
        handled = set()
    for index, query_len in enumerate(query_lens):
        if query_len == 0 or index in handled:
            continue
        start = starts[index]
        output[start : start + query_len] = attend_one_request(
            query[start : start + query_len], kv_cache, metadata, index, scale, kv_scales
        )
    return output


def decode_attention(
    query: torch.Tensor,  # [num_decodes, num_heads, head_dim], one row per request
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    request_indices: list[int],
    scale: float,
    kv_scales: KVScales | None = None,
) -> torch.Tensor:  # [num_decodes, num_heads, head_dim]
    num_decodes, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    block_size = metadata.block_size
    seq_lens_host = [metadata.seq_lens_host[i] for i in request_indices]
    max_seq_len = max(seq_lens_host)
    num_blocks = (max_seq_len + block_size - 1) // block_size
    index = torch.tensor(request_indices, dtype=torch.long)
    blocks = metadata.block_tables[index, :num_blocks].long().to(kv_cache.device)
    # [num_decodes, num_blocks * block_size, kv_heads, dim] -> [num_decodes, kv_heads, ctx, dim]
    keys, values = gather_cached(kv_cache, blocks, query.dtype, kv_scales)
    keys = keys.flatten(1, 2)[:, :max_seq_len].transpose(1, 2)
    values = values.flatten(1, 2)[:, :max_seq_len].transpose(1, 2)
    seq_lens = torch.tensor(seq_lens_host, device=query.device)
    positions = torch.arange(max_seq_len, device=query.device)
    mask = (positions[None, :] < seq_lens[:, None])[:, None, None, :]
    attended = F.scaled_dot_product_attention(
        query.unsqueeze(2),  # [num_decodes, heads, 1, dim]
        keys,
        values,
        attn_mask=mask,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )
    return attended.squeeze(2)
