"""Reference attention in plain torch: gathers each request's context from the paged cache and
runs SDPA with a causal offset mask. Correct for any mix of prefill chunks and decodes; used on
the CPU and as the reference that the Triton kernels are tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ladle.attention.base import KVScales, write_kv_cache
from ladle.attention.kv_quant import dequantize_kv
from ladle.attention.metadata import AttentionMetadata


class TorchAttentionBackend:
    name = "torch"

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,
        cache_written: bool = False,
    ) -> torch.Tensor:
        if not cache_written:
            write_kv_cache(key, value, kv_cache, metadata.slot_mapping, kv_scales)
        return self.attend(query, kv_cache, metadata, scale, kv_scales)

    @staticmethod
    def attend(
        query: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
        kv_scales: KVScales | None = None,
    ) -> torch.Tensor:
        return paged_attention_reference(query, kv_cache, metadata, scale, kv_scales)


def gather_cached(
    kv_cache: torch.Tensor,
    blocks: torch.Tensor,
    dtype: torch.dtype,
    kv_scales: KVScales | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of `blocks` ([..., n] block ids -> [..., n, block_size, kv_heads, dim])
    in `dtype`, dequantized when the cache is float8 (kv_scales given)."""
    keys, values = kv_cache[0, blocks], kv_cache[1, blocks]
    if kv_scales is None:
        return keys, values
    return dequantize_kv(keys, kv_scales[0], dtype), dequantize_kv(values, kv_scales[1], dtype)


def paged_attention_reference(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    kv_scales: KVScales | None = None,
) -> torch.Tensor:
    """Attention of every query row over its request's cached context, one request at a time
    (a float8 cache is read as codes * scale, with kv_scales)."""
    output = torch.empty_like(query)
    starts = metadata.query_start_loc_host
    for index in range(metadata.num_reqs):
        start, end = starts[index], starts[index + 1]
        if end > start:
            output[start:end] = attend_one_request(
                query[start:end], kv_cache, metadata, index, scale, kv_scales
            )
    return output


def attend_one_request(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    index: int,
    scale: float,
    kv_scales: KVScales | None = None,
) -> torch.Tensor:
    """Request `index`'s query rows [query_len, heads, dim] over its cached context."""
    num_heads = query.shape[1]
    num_kv_heads = kv_cache.shape[3]
    block_size = metadata.block_size
    seq_len = metadata.seq_lens_host[index]
    query_len = query.shape[0]
    num_blocks = (seq_len + block_size - 1) // block_size
    blocks = metadata.block_tables[index, :num_blocks].long()
    keys, values = gather_cached(kv_cache, blocks, query.dtype, kv_scales)
    keys = keys.reshape(-1, num_kv_heads, kv_cache.shape[4])[:seq_len]
    values = values.reshape(-1, num_kv_heads, kv_cache.shape[4])[:seq_len]
    # [heads, tokens, dim]; GQA by repeating each kv head over its query group.
    q = query.transpose(0, 1)
    k = keys.transpose(0, 1).repeat_interleave(num_heads // num_kv_heads, dim=0)
    v = values.transpose(0, 1).repeat_interleave(num_heads // num_kv_heads, dim=0)
    # Query row i sits at context position seq_len - query_len + i and sees positions <= it.
    query_positions = torch.arange(seq_len - query_len, seq_len, device=query.device)
    key_positions = torch.arange(seq_len, device=query.device)
    mask = key_positions[None, :] <= query_positions[:, None]
    attended = F.scaled_dot_product_attention(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), attn_mask=mask, scale=scale
    )
    return attended[0].transpose(0, 1)
