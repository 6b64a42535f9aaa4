"""The GPU attention backend: a fused Triton cache write, then the paged attention kernel.

No host syncs: launch decisions read only metadata's host ints (max_query_len) and tensor
shapes. A pure decode step (max_query_len == 1) launches a grid that depends on the batch size
alone, so it can be captured in a CUDA graph and replayed with new lengths and block tables.
"""

from __future__ import annotations

import torch

from ladle.attention.metadata import AttentionMetadata
from ladle.kernels.paged_attention import LaunchConfig, paged_attention
from ladle.kernels.reshape_and_cache import reshape_and_cache


class TritonAttentionBackend:
    """AttentionBackend over the paged cache with Triton kernels (CUDA, or TRITON_INTERPRET=1)."""

    name = "triton"

    def __init__(self, config: LaunchConfig | None = None) -> None:
        self.config = config

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        reshape_and_cache(key, value, kv_cache, metadata.slot_mapping)
        return paged_attention(
            query,
            kv_cache,
            metadata.block_tables,
            metadata.query_start_loc,
            metadata.seq_lens,
            max_query_len=metadata.max_query_len,
            scale=scale,
            config=self.config,
        )
