"""The batched CPU attention backend against the per-request reference, on random paged caches."""

from __future__ import annotations

import random

import pytest
import torch

from ladle.attention.cpu_backend import batched_paged_attention
from ladle.attention.metadata import AttentionMetadata
from ladle.attention.torch_backend import paged_attention_reference


def _random_step(query_lens: list[int], context_lens: list[int], block_size: int, seed: int):
    """A step over a shuffled paged cache: request i has context_lens[i] cached tokens, of which
    its last query_lens[i] are this step's query rows."""
    generator = torch.Generator().manual_seed(seed)
    num_heads, num_kv_heads, head_dim = 6, 2, 16
    blocks_per_req = [(n + block_size - 1) // block_size for n in context_lens]
    num_blocks = sum(blocks_per_req) + 1
    block_ids = list(range(1, num_blocks))
    random.Random(seed).shuffle(block_ids)
    table = torch.zeros(len(query_lens), max(blocks_per_req), dtype=torch.int32)
    taken = 0
    for i, count in enumerate(blocks_per_req):
        table[i, :count] = torch.tensor(block_ids[taken : taken + count])
        taken += count
    kv_cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=generator)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    query = torch.randn(starts[-1], num_heads, head_dim, generator=generator)
    metadata = AttentionMetadata(
        slot_mapping=torch.zeros(starts[-1], dtype=torch.long),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(context_lens, dtype=torch.int32),
        block_tables=table,
        max_query_len=max(query_lens),
        max_seq_len=max(context_lens),
        block_size=block_size,
        query_start_loc_host=starts,
        seq_lens_host=list(context_lens),
    )
    return query, kv_cache, metadata


@pytest.mark.parametrize(
    ("query_lens", "context_lens"),
    [
        ([1], [1]),  # one token, first position
        ([1] * 7, [1, 7, 16, 17, 33, 100, 5]),  # all decodes, lengths around the block size
        ([5, 1, 1, 16, 1], [5, 40, 17, 20, 1]),  # prefill chunks mixed with decodes
        ([3, 1], [9, 16]),  # one decode beside one chunk
    ],
)
def test_batched_attention_matches_reference(query_lens, context_lens):
    query, kv_cache, metadata = _random_step(query_lens, context_lens, block_size=16, seed=3)
    expected = paged_attention_reference(query, kv_cache, metadata, scale=0.25)
    actual = batched_paged_attention(query, kv_cache, metadata, scale=0.25)
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)


def test_decode_plan_is_built_once_per_step_and_serves_every_layer():
    """The decode rows' gather plan is cached on the step's metadata; a second layer (another
    cache) reuses it and still matches the reference."""
    context_lens = [1, 7, 16, 17, 33]
    query, kv_cache, metadata = _random_step([1] * 5, context_lens, block_size=16, seed=6)
    first = batched_paged_attention(query, kv_cache, metadata, scale=0.25)
    assert len(metadata.backend_cache) == 1
    other_layer = torch.randn_like(kv_cache)
    second = batched_paged_attention(query, other_layer, metadata, scale=0.25)
    assert len(metadata.backend_cache) == 1
    torch.testing.assert_close(
        first, paged_attention_reference(query, kv_cache, metadata, 0.25), rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        second,
        paged_attention_reference(query, other_layer, metadata, 0.25),
        rtol=1e-5,
        atol=1e-5,
    )
