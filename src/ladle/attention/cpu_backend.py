"""Batched paged attention for the CPU: every decode row of a step in one gather and one SDPA call.

The reference backend (torch_backend.py) loops over requests, which at 32 concurrent decodes and
30 layers is ~1000 small SDPA calls per step, and Python overhead dominates. Here the decode rows
(query length 1, the bulk of a serving step) are attended together: their blocks are gathered
into one [num_decodes, max_context, kv_heads, head_dim] tensor, positions past each request's
context are masked, and one grouped-query SDPA call does the rest. Prefill chunks (few per step,
each long) still go through the reference path one request at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ladle.attention.base import KVScales
from ladle.attention.kv_quant import dequantize_kv
from ladle.attention.metadata import AttentionMetadata
from ladle.attention.torch_backend import TorchAttentionBackend, attend_one_request
from ladle.kernels.cpu_native.decode_ops import paged_decode_attention


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
    plan = decode_gather_plan(metadata, request_indices, kv_cache.device)
    context_len = plan.context_len
    if kv_scales is None:
        # The C kernel reads the slots in place: no gathered copy, no mask, one call.
        attended = paged_decode_attention(
            query.contiguous(), kv_cache, plan.slots, plan.lengths, context_len, scale
        )
        if attended is not None:
            return attended
    # [num_decodes * ctx, kv_heads, dim] -> [num_decodes, kv_heads, ctx, dim]; index_select on
    # flat slots is ~5x cheaper than advanced indexing with a block table.
    keys = kv_cache[0].view(-1, num_kv_heads, head_dim).index_select(0, plan.slots)
    values = kv_cache[1].view(-1, num_kv_heads, head_dim).index_select(0, plan.slots)
    keys = keys.view(num_decodes, context_len, num_kv_heads, head_dim).transpose(1, 2)
    values = values.view(num_decodes, context_len, num_kv_heads, head_dim).transpose(1, 2)
    if kv_scales is not None:  # a float8 cache: codes * scale, in the query's dtype
        keys = dequantize_kv(keys, kv_scales[0], query.dtype)
        values = dequantize_kv(values, kv_scales[1], query.dtype)
    attended = F.scaled_dot_product_attention(
        query.unsqueeze(2),  # [num_decodes, heads, 1, dim]
        keys,
        values,
        attn_mask=plan.mask,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )
    return attended.squeeze(2)


@dataclass(frozen=True)
class DecodeGatherPlan:
    """Where the decode rows' contexts lie in the flat cache, shared by every layer of a step."""

    slots: torch.Tensor  # int64 [num_decodes * context_len]; past a context's end, slot 0
    context_len: int  # the longest context among the decode rows
    mask: torch.Tensor | None  # bool [num_decodes, 1, 1, context_len], None when all are full
    lengths: torch.Tensor  # int64 [num_decodes]: each row's context length


def decode_gather_plan(
    metadata: AttentionMetadata, request_indices: list[int], device: torch.device
) -> DecodeGatherPlan:
    """The plan for these decode rows, built by the step's first layer and reused by the rest
    (a decode step of the default model has 30 layers; the plan is a dozen small ops)."""
    key = ("cpu_decode_plan", tuple(request_indices))
    plan = metadata.backend_cache.get(key)
    if plan is not None:
        return plan
    block_size = metadata.block_size
    seq_lens_host = [metadata.seq_lens_host[i] for i in request_indices]
    context_len = max(seq_lens_host)
    num_blocks = (context_len + block_size - 1) // block_size
    index = torch.tensor(request_indices, dtype=torch.long)
    blocks = metadata.block_tables[index, :num_blocks].long().to(device)
    offsets = torch.arange(block_size, device=device)
    slots = (blocks[:, :, None] * block_size + offsets).flatten(1)[:, :context_len]
    mask = None
    if min(seq_lens_host) != context_len:
        seq_lens = torch.tensor(seq_lens_host, device=device)
        valid = torch.arange(context_len, device=device)[None, :] < seq_lens[:, None]
        # Padded positions read slot 0 (the null block) and are masked out.
        slots = slots.masked_fill(~valid, 0)
        mask = valid[:, None, None, :]
    lengths = torch.tensor(seq_lens_host, dtype=torch.long, device=device)
    plan = DecodeGatherPlan(slots.reshape(-1).contiguous(), context_len, mask, lengths)
    metadata.backend_cache[key] = plan
    return plan
