"""The GPU attention backend: a fused Triton cache write, then the paged attention kernel.

No host syncs: launch decisions read only metadata's host values (max_query_len, the host copy
of query_start_loc) and tensor shapes. A pure decode step (max_query_len == 1) launches a grid
that depends on the batch size alone, so it can be captured in a CUDA graph and replayed with new
lengths and block tables. In a mixed step, the decodes at the front of the batch get their own
launch (a runner that orders decodes first gets the most from this). A step marked
graph_launches takes a prefill graph's launches instead: one general launch with fixed tiles.
"""

from __future__ import annotations

import torch

from ladle.attention.base import KVScales
from ladle.attention.fresh_prefill import MIN_FRESH_TOKENS, attend_fresh_prompt, fresh_prompt_span
from ladle.attention.metadata import AttentionMetadata
from ladle.kernels.paged_attention import GRAPH_TILE_QUERY_LEN, LaunchConfig, paged_attention
from ladle.kernels.reshape_and_cache import reshape_and_cache


class TritonAttentionBackend:
    """AttentionBackend over the paged cache with Triton kernels (CUDA, or TRITON_INTERPRET=1)."""

    name = "triton"

    def __init__(self, config: LaunchConfig | None = None) -> None:
        self.config = config
        # Every layer of a step sees the same metadata: count its leading decodes once.
        self._counted_metadata: AttentionMetadata | None = None
        self._num_leading_decodes = 0

    def _leading_decodes(self, metadata: AttentionMetadata) -> int:
        if metadata.max_query_len <= 1 or metadata.graph_launches:
            return 0
        if metadata is not self._counted_metadata:
            starts = metadata.query_start_loc_host
            count = 0
            while count < metadata.num_reqs and starts[count + 1] - starts[count] <= 1:
                count += 1
            self._counted_metadata, self._num_leading_decodes = metadata, count
        return self._num_leading_decodes

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
        k_scale, v_scale = kv_scales if kv_scales is not None else (None, None)
        if not cache_written:
            reshape_and_cache(key, value, kv_cache, metadata.slot_mapping, k_scale, v_scale)
        leading = self._leading_decodes(metadata)
        span = (
            fresh_prompt_span(metadata, leading)
            if metadata.max_query_len >= MIN_FRESH_TOKENS
            else None
        )
        if span is not None:
            # One long fresh prompt (and any decodes before it): cuDNN's SDPA for the prompt.
            output = torch.empty_like(query)
            if leading:
                paged_attention(
                    query[:leading],
                    kv_cache,
                    metadata.block_tables[:leading],
                    metadata.query_start_loc[: leading + 1],
                    metadata.seq_lens[:leading],
                    max_query_len=1,
                    scale=scale,
                    output=output[:leading],
                    config=self.config,
                    k_scale=k_scale,
                    v_scale=v_scale,
                )
            # The prompt attends over its own fresh keys and values, never the (maybe fp8) cache.
            attend_fresh_prompt(query, key, value, output, span, scale)
            return output
        # A prefill graph's tiles must fit any query length its replays bring.
        max_query_len = GRAPH_TILE_QUERY_LEN if metadata.graph_launches else metadata.max_query_len
        return paged_attention(
            query,
            kv_cache,
            metadata.block_tables,
            metadata.query_start_loc,
            metadata.seq_lens,
            max_query_len=max_query_len,
            scale=scale,
            num_leading_decodes=leading,
            launch_num_reqs=metadata.launch_num_reqs,
            launch_num_tokens=metadata.launch_num_tokens,
            config=self.config,
            k_scale=k_scale,
            v_scale=v_scale,
        )
