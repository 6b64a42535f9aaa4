"""Paged attention in Triton for a flattened varlen batch that mixes prefill chunks and decodes.

Layout (one layer): kv_cache [2, num_blocks, block_size, num_kv_heads, head_dim], contiguous;
block_tables [num_reqs, max_blocks] int32; query_start_loc [num_reqs + 1] int32; seq_lens
[num_reqs] int32. Query token i of a request sits at context position seq_len - query_len + i and
attends to context positions <= it. The torch reference is
ladle.attention.torch_backend.paged_attention_reference.

One program owns one query tile (up to BLOCK_M tokens of one request) times all the query heads
of one kv head, so each K/V tile is loaded once per GQA group: the tile has BLOCK_M * GROUP rows,
row r being token r // GROUP_PADDED and head r % GROUP_PADDED of the group. It streams the
request's context in BLOCK_N-token tiles, gathering each token's page through the block table,
with an online softmax in fp32 (base 2, the scale folded into log2(e)).

Finding the request of a tile without a host sync: request i's tiles are numbered from
query_start_loc[i] // BLOCK_M + i. That start is non-decreasing in i and leaves room for
ceil(query_len / BLOCK_M) tiles, so a grid of num_tokens // BLOCK_M + num_reqs tiles covers every
request, and a binary search over query_start_loc maps a tile to its request; spare tiles exit.
A float8 e4m3 cache (KV_FP8) is read as codes converted to float16 (the query too), Hopper's
one-instruction conversion: k_scale folds into the softmax scale and v_scale multiplies the
normalised output, so each tile costs one conversion per element and no extra multiply
(reference: ladle.attention.kv_quant).

When every query is one token (decode), tile i is simply request i, and the context can be split
over num_splits programs (split-KV) so that small batches of long contexts still fill the GPU.
The grid then depends only on the batch size, which CUDA graphs need. The splits merge without a
second launch: each writes its float32 partial output and log-sum-exp per query row, then takes
a ticket from its (tile, kv head) counter (kernels/split_counters.py); the split that arrives
last combines all of them in split order (so the result does not depend on arrival order) and
resets the counter. At batch 1 on an H100 the merge launch it replaces cost ~2 us of each
layer's step.

A launch with longer queries splits too when its tiles are too few to fill the GPU: a
speculative verify step (k + 1 query tokens a request) or a small chunk over a long context. Its
split count follows the tile count that the launch is sized for (a prefill graph's bucket, also
when such a step runs eagerly), so graphs and eager runs sum alike. Unsplit, a batch-1 verify
step's attention was 19 us a layer against the decode's ~5 on the Qwen3-0.6B shape (H200): one
program per tile walked the whole context. Its splits merge in a second launch, one program per
(query token, kv head): merged by the last split to arrive, a tile's tokens would be combined
one after another, two trips to L2 each.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ladle.kernels.pdl import enter_dependent_launch, pdl_launch
from ladle.kernels.split_counters import arrives_last, counter_buffer, reset_counter

LOG2_E = 1.4426950408889634
# The split-KV factor is a runtime value up to this, so the many factors that batch sizes pick
# share two compiled decode variants (split or not).
MAX_SPLITS = 16
# A max_query_len that gives a prefill launch its tallest tile (the default block_rows): what a
# CUDA graph's template passes, since its replays bring query lengths the capture cannot know.
GRAPH_TILE_QUERY_LEN = 1 << 16


@triton.jit
def _find_request(query_start_loc_ptr, tile, num_reqs, BLOCK_M: tl.constexpr):
    """The last request whose first tile (query_start_loc[i] // BLOCK_M + i) is <= tile."""
    low = tile * 0  # a tensor from the start, so the loop-carried types agree
    high = low + num_reqs
    while high - low > 1:
        middle = (low + high) // 2
        first_tile = tl.load(query_start_loc_ptr + middle) // BLOCK_M + middle
        is_at_or_before = first_tile <= tile
        low = tl.where(is_at_or_before, middle, low)
        high = tl.where(is_at_or_before, high, middle)
    return low


@triton.jit
def _attend_kv_tiles(
    row_max,
    row_sum,
    accumulator,
    query,
    query_position,
    key_cache_ptr,
    value_cache_ptr,
    block_table_ptr,
    kv_tile_begin,
    kv_tile_end,
    context_end,
    scale_log2,
    stride_cache_block,
    stride_cache_token,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Online softmax over context tiles [kv_tile_begin, kv_tile_end) of one kv head."""
    dims = tl.arange(0, HEAD_DIM)
    for kv_tile in range(kv_tile_begin, kv_tile_end):
        positions = kv_tile * BLOCK_N + tl.arange(0, BLOCK_N)
        if MASKED:
            is_in_context = positions < context_end
            block_ids = tl.load(
                block_table_ptr + positions // BLOCK_SIZE, mask=is_in_context, other=0
            )
        else:
            block_ids = tl.load(block_table_ptr + positions // BLOCK_SIZE)
        kv_offsets = (
            block_ids.to(tl.int64) * stride_cache_block
            + (positions % BLOCK_SIZE) * stride_cache_token
        )
        kv_pointers = kv_offsets[:, None] + dims[None, :]
        if MASKED:
            key = tl.load(key_cache_ptr + kv_pointers, mask=is_in_context[:, None], other=0.0)
        else:
            key = tl.load(key_cache_ptr + kv_pointers)
        key = key.to(query.dtype)  # float8 codes -> float16 (the query's); else a no-op
        scores = tl.dot(query, tl.trans(key)) * scale_log2
        if MASKED:
            is_visible = (positions[None, :] <= query_position[:, None]) & is_in_context[None, :]
            scores = tl.where(is_visible, scores, float("-inf"))
            new_max = tl.maximum(row_max, tl.max(scores, axis=1))
            # A row that has seen no visible key keeps -inf; shift it by 0, not inf - inf.
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        else:
            new_max = tl.maximum(row_max, tl.max(scores, axis=1))
            shift = new_max
        correction = tl.exp2(row_max - shift)
        probabilities = tl.exp2(scores - shift[:, None])
        row_sum = row_sum * correction + tl.sum(probabilities, axis=1)
        if MASKED:
            value = tl.load(value_cache_ptr + kv_pointers, mask=is_in_context[:, None], other=0.0)
        else:
            value = tl.load(value_cache_ptr + kv_pointers)
        value = value.to(query.dtype)
        accumulator = accumulator * correction[:, None] + tl.dot(
            probabilities.to(value.dtype), value
        )
        row_max = new_max
    return row_max, row_sum, accumulator


@triton.jit(
    # Per-step values: specialising on them (== 1, divisible by 16, 16-byte aligned slices of
    # the step's metadata) would compile new variants while serving (kernels/compile_log.py).
    do_not_specialize=["num_reqs", "num_splits", "stride_block_tables"],
    do_not_specialize_on_alignment=[
        "block_tables_ptr",
        "query_start_loc_ptr",
        "seq_lens_ptr",
        "k_scale_ptr",  # seq_lens stands in for the scales when the cache is not float8
        "v_scale_ptr",
        "counter_ptr",  # and for the counters when the launch is not split
    ],
)
def _paged_attention_kernel(
    output_ptr,
    query_ptr,
    key_cache_ptr,
    value_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    split_output_ptr,  # [num_tokens, num_heads, num_splits, HEAD_DIM] fp32, when IS_SPLIT
    split_lse_ptr,  # [num_tokens, num_heads, num_splits] fp32 (log2 units)
    counter_ptr,  # [num_reqs * num_kv_heads] int32 arrival tickets, zero between launches
    k_scale_ptr,  # [1] fp32, read when KV_FP8
    v_scale_ptr,
    scale_log2,
    num_reqs,
    num_splits,
    num_heads,
    stride_query_token,
    stride_query_head,
    stride_output_token,
    stride_output_head,
    stride_cache_block,
    stride_cache_token,
    stride_cache_head,
    stride_block_tables,
    GROUP: tl.constexpr,
    GROUP_PADDED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILES_ARE_REQUESTS: tl.constexpr,
    IS_SPLIT: tl.constexpr,
    MERGE_ON_ARRIVAL: tl.constexpr = True,
    KV_FP8: tl.constexpr = False,
    USE_PDL: tl.constexpr = False,
    SPLITS_PADDED: tl.constexpr = 1,
    SPLIT_CHUNK: tl.constexpr = 1,
):
    enter_dependent_launch(USE_PDL)  # kernels/pdl.py
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    if TILES_ARE_REQUESTS:
        request = tile
        tile_in_request = 0
    else:
        # Launch the last tiles first: near the diagonal they see the most keys (less tail).
        tile = tl.num_programs(0) - 1 - tile
        request = _find_request(query_start_loc_ptr, tile, num_reqs, BLOCK_M)
    query_start = tl.load(query_start_loc_ptr + request)
    query_len = tl.load(query_start_loc_ptr + request + 1) - query_start
    if not TILES_ARE_REQUESTS:
        tile_in_request = tile - (query_start // BLOCK_M + request)
    first_token = tile_in_request * BLOCK_M
    if TILES_ARE_REQUESTS:
        if query_len == 0:
            return
    else:
        # Spare tiles: past the request's queries, or (when the requests handed in start after
        # token 0, the leading decodes launched apart) before the first request's first tile.
        if (first_token >= query_len) | (first_token < 0):
            return
    seq_len = tl.load(seq_lens_ptr + request)
    context_start = seq_len - query_len  # context position of the request's query token 0

    rows = tl.arange(0, BLOCK_ROWS)
    token_in_request = first_token + rows // GROUP_PADDED
    head_in_group = rows % GROUP_PADDED
    head = kv_head * GROUP + head_in_group
    is_row_valid = (token_in_request < query_len) & (head_in_group < GROUP)
    query_position = context_start + token_in_request
    dims = tl.arange(0, HEAD_DIM)

    query_rows = (query_start + token_in_request).to(tl.int64)
    query_offsets = query_rows * stride_query_token + head * stride_query_head
    query = tl.load(
        query_ptr + query_offsets[:, None] + dims[None, :], mask=is_row_valid[:, None], other=0.0
    )
    if KV_FP8:
        scale_log2 = scale_log2 * tl.load(k_scale_ptr)
        # The tiles multiply in float16: e4m3 -> float16 is one exact conversion per pair of
        # codes on Hopper, where e4m3 -> bfloat16 takes several instructions per code and bound
        # the kernel (1.3-1.7 TB/s against bf16's 2.0-2.7). The query's bfloat16 values fit
        # float16 (attention queries are far below its 65504 limit) with more mantissa.
        query = query.to(tl.float16)
    else:
        query = query.to(key_cache_ptr.dtype.element_ty)

    # Keys past the tile's last query position are masked for every row: stop there.
    last_token = tl.minimum(first_token + BLOCK_M, query_len)
    context_end = context_start + last_token
    num_kv_tiles = tl.cdiv(context_end, BLOCK_N)
    if IS_SPLIT:
        tiles_per_split = tl.cdiv(num_kv_tiles, num_splits)
        kv_tile_begin = split * tiles_per_split
        kv_tile_end = tl.minimum(kv_tile_begin + tiles_per_split, num_kv_tiles)
    else:
        kv_tile_begin = 0
        kv_tile_end = num_kv_tiles

    # Tiles wholly at or before the tile's first query position are visible to every row and
    # inside the context: no masks there. Only the tiles near the diagonal (and a decode's last
    # tile) pay for the causal and length masks.
    num_unmasked_tiles = (context_start + first_token + 1) // BLOCK_N
    row_max = tl.full([BLOCK_ROWS], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    accumulator = tl.zeros([BLOCK_ROWS, HEAD_DIM], dtype=tl.float32)
    block_table = block_tables_ptr + request.to(tl.int64) * stride_block_tables
    key_cache_ptr += kv_head * stride_cache_head
    value_cache_ptr += kv_head * stride_cache_head
    row_max, row_sum, accumulator = _attend_kv_tiles(
        row_max,
        row_sum,
        accumulator,
        query,
        query_position,
        key_cache_ptr,
        value_cache_ptr,
        block_table,
        kv_tile_begin,
        tl.minimum(kv_tile_end, num_unmasked_tiles),
        context_end,
        scale_log2,
        stride_cache_block,
        stride_cache_token,
        BLOCK_N,
        HEAD_DIM,
        BLOCK_SIZE,
        False,
    )
    row_max, row_sum, accumulator = _attend_kv_tiles(
        row_max,
        row_sum,
        accumulator,
        query,
        query_position,
        key_cache_ptr,
        value_cache_ptr,
        block_table,
        tl.maximum(kv_tile_begin, num_unmasked_tiles),
        kv_tile_end,
        context_end,
        scale_log2,
        stride_cache_block,
        stride_cache_token,
        BLOCK_N,
        HEAD_DIM,
        BLOCK_SIZE,
        True,
    )

    safe_sum = tl.where(row_sum == 0.0, 1.0, row_sum)
    accumulator = accumulator / safe_sum[:, None]
    if KV_FP8:
        accumulator = accumulator * tl.load(v_scale_ptr)
    if IS_SPLIT:
        # Always written, also by an empty split (sum 0 -> lse -inf), so the merge reads no garbage.
        lse = tl.where(row_sum == 0.0, float("-inf"), row_max + tl.log2(safe_sum))
        first_split_row = (query_rows * num_heads + head) * num_splits
        tl.store(split_lse_ptr + first_split_row + split, lse, mask=is_row_valid)
        tl.store(
            split_output_ptr + (first_split_row + split)[:, None] * HEAD_DIM + dims[None, :],
            accumulator,
            mask=is_row_valid[:, None],
        )
        if MERGE_ON_ARRIVAL:  # a decode tile: one query token
            counter = counter_ptr + tile * tl.num_programs(1) + kv_head
            if arrives_last(counter, num_splits):
                _merge_splits(
                    output_ptr,
                    split_output_ptr,
                    split_lse_ptr,
                    query_start.to(tl.int64) * stride_output_token,
                    stride_output_head,
                    query_start.to(tl.int64),
                    kv_head,
                    num_heads,
                    num_splits,
                    GROUP,
                    GROUP_PADDED,
                    HEAD_DIM,
                    SPLITS_PADDED,
                    SPLIT_CHUNK,
                )
                reset_counter(counter)
    else:
        output_offsets = query_rows * stride_output_token + head * stride_output_head
        tl.store(
            output_ptr + output_offsets[:, None] + dims[None, :],
            accumulator.to(output_ptr.dtype.element_ty),
            mask=is_row_valid[:, None],
        )


@triton.jit
def _merge_splits(
    output_ptr,
    split_output_ptr,
    split_lse_ptr,
    token_offset,
    stride_output_head,
    query_row,
    kv_head,
    num_heads,
    num_splits,
    GROUP: tl.constexpr,
    GROUP_PADDED: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS_PADDED: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
):
    """Write one query token's output for the GROUP query heads of kv_head: each split's
    normalised output weighted by exp2(its lse - the largest lse). SPLIT_CHUNK splits' partials
    are loaded at once (a serial loop over single splits cost ~7 us at batch 1 on an H100, as
    many L2 round trips as splits); they come from L2 (.cg), since other programs wrote them."""
    heads_in_group = tl.arange(0, GROUP_PADDED)
    is_head = heads_in_group < GROUP
    head = kv_head * GROUP + heads_in_group
    first_rows = (query_row * num_heads + head) * num_splits  # [GROUP_PADDED]
    splits = tl.arange(0, SPLITS_PADDED)
    lse = tl.load(
        split_lse_ptr + first_rows[:, None] + splits[None, :],
        mask=is_head[:, None] & (splits[None, :] < num_splits),
        other=float("-inf"),
        cache_modifier=".cg",
    )
    max_lse = tl.max(lse, axis=1)
    max_lse = tl.where(max_lse == float("-inf"), 0.0, max_lse)  # finite for a real head
    dims = tl.arange(0, HEAD_DIM)
    chunk = tl.arange(0, SPLIT_CHUNK)
    total = tl.zeros([GROUP_PADDED, HEAD_DIM], dtype=tl.float32)
    weight_sum = tl.zeros([GROUP_PADDED], dtype=tl.float32)
    for first_split in range(0, num_splits, SPLIT_CHUNK):
        rows = first_rows[:, None] + (first_split + chunk)[None, :]  # [GROUP_PADDED, CHUNK]
        is_split = is_head[:, None] & ((first_split + chunk)[None, :] < num_splits)
        chunk_lse = tl.load(
            split_lse_ptr + rows, mask=is_split, other=float("-inf"), cache_modifier=".cg"
        )
        has_keys = chunk_lse > float("-inf")
        weight = tl.where(has_keys, tl.exp2(chunk_lse - max_lse[:, None]), 0.0)
        # Masked by the split count only, not by the lse: then every load of the merge can be
        # in flight at once (an empty split's partial is 0, and its weight 0).
        partial = tl.load(
            split_output_ptr + rows[:, :, None] * HEAD_DIM + dims[None, None, :],
            mask=is_split[:, :, None],
            other=0.0,
            cache_modifier=".cg",
        )
        total += tl.sum(partial * weight[:, :, None], axis=1)
        weight_sum += tl.sum(weight, axis=1)
    merged = total / tl.where(weight_sum == 0.0, 1.0, weight_sum)[:, None]
    tl.store(
        output_ptr + token_offset + head[:, None] * stride_output_head + dims[None, :],
        merged.to(output_ptr.dtype.element_ty),
        mask=is_head[:, None],
    )


@triton.jit(
    do_not_specialize=["num_reqs", "num_splits"],
    do_not_specialize_on_alignment=["query_start_loc_ptr"],
)
def _merge_split_rows_kernel(
    output_ptr,
    split_output_ptr,
    split_lse_ptr,
    query_start_loc_ptr,
    num_reqs,
    num_heads,
    num_splits,
    stride_output_token,
    stride_output_head,
    GROUP: tl.constexpr,
    GROUP_PADDED: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    SPLITS_PADDED: tl.constexpr,
    SPLIT_CHUNK: tl.constexpr,
):
    """The merge of a split launch with longer queries: one program per (query token, kv head);
    tokens outside the launch's requests (decodes launched apart, padding) are left alone."""
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    first_row = tl.load(query_start_loc_ptr)
    end_row = tl.load(query_start_loc_ptr + num_reqs)
    if (row < first_row) | (row >= end_row):
        return
    row = row.to(tl.int64)
    _merge_splits(
        output_ptr,
        split_output_ptr,
        split_lse_ptr,
        row * stride_output_token,
        stride_output_head,
        row,
        kv_head,
        num_heads,
        num_splits,
        GROUP,
        GROUP_PADDED,
        HEAD_DIM,
        SPLITS_PADDED,
        SPLIT_CHUNK,
    )


@dataclass(frozen=True)
class LaunchConfig:
    """Tile shape and compiler settings of one launch; None fields take the defaults."""

    block_rows: int | None = None  # query rows (tokens x heads of a group) per program
    block_n: int | None = None  # context tokens per inner step
    num_warps: int | None = None
    num_stages: int | None = None
    num_splits: int | None = None  # decode only: programs sharing one request's context


@functools.cache
def _num_multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(num_tiles: int, num_kv_heads: int, device: torch.device) -> int:
    """Split-KV factor for a launch of num_tiles query tiles (a decode's requests): none once the
    tiles alone give two programs per multiprocessor, else about eight programs per
    multiprocessor, at most 16.

    Measured on an H100 (scripts/fp8_kv_decode_sweep.py --wide, 8B heads): 64 x 1024 and 128 x
    768 ran 6-28% faster unsplit than with the 2-3 splits that "eight per SM" gave them (the
    merge launch and the splits' partial writes cost more than the extra programs hide), while 8
    x 4096 wants all 16 splits. It depends on the batch shape only (not on context lengths), so a
    CUDA graph captured for a batch size stays right for any context; short contexts leave
    splits empty, which costs one tiny merge launch.
    """
    if device.type != "cuda":
        return 1
    multiprocessors = _num_multiprocessors(device.index or 0)
    programs = max(1, num_tiles * num_kv_heads)
    if programs >= 2 * multiprocessors:
        return 1
    return max(1, min(MAX_SPLITS, triton.cdiv(8 * multiprocessors, programs)))


# A float8 cache's decode tile, for batches of at least this many (request, kv head) programs:
# 32-token steps on one warp. Half the bytes of a bfloat16 tile leave the per-step fixed work
# (block-table gather, softmax, the e4m3 -> float16 conversion) exposed, and one warp per
# program runs more programs per SM to hide it: 256 x 1024 0.249 -> 0.210 ms, 128 x 768 0.127
# -> 0.091 ms against 128-token steps on four warps (the bfloat16 cache gains nothing from it).
# A single sequence keeps the default tile (1 x 768: 0.0129 against 0.0146 ms).
FP8_SMALL_TILE_MIN_PROGRAMS = 64


def paged_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    max_query_len: int,
    scale: float,
    num_leading_decodes: int = 0,
    launch_num_reqs: int | None = None,
    launch_num_tokens: int | None = None,
    output: torch.Tensor | None = None,
    config: LaunchConfig | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of query [num_tokens, num_heads, head_dim] over the paged cache; no host syncs.

    max_query_len (a host int, metadata.max_query_len) picks the launch: <= 1 means a pure decode
    batch, grid [num_reqs, num_kv_heads, num_splits]. In a mixed batch whose first
    num_leading_decodes requests have query_len <= 1 (host knowledge, e.g. from
    metadata.query_start_loc_host), those get the decode launch and the rest the prefill launch,
    so decodes do not pay for prefill-sized query tiles. Output rows past the last request
    (padding tokens) are left unwritten. A float8 e4m3 kv_cache needs k_scale and v_scale
    (float32, one element each: the layer's dequantization scales). launch_num_reqs and
    launch_num_tokens: size the launch's split-KV factor as for this many requests and tokens
    (a CUDA graph bucket's padded counts), so a step gives the same numbers eagerly as from its
    graph.
    """
    num_tokens, num_heads, head_dim = query.shape
    _, _, block_size, num_kv_heads, cache_head_dim = kv_cache.shape
    num_reqs = seq_lens.shape[0]
    assert cache_head_dim == head_dim, "query and cache head_dim differ"
    assert head_dim >= 16 and head_dim & (head_dim - 1) == 0, (
        "head_dim must be a power of two >= 16"
    )
    assert block_size & (block_size - 1) == 0, "block_size must be a power of two"
    assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
    assert kv_cache.is_contiguous(), "kv_cache must be contiguous"
    assert query.stride(2) == 1, "query's head_dim must be contiguous"
    config = config or LaunchConfig()
    kv_scales = None
    if kv_cache.dtype == torch.float8_e4m3fn:
        if k_scale is None or v_scale is None:
            raise ValueError("a float8 KV cache needs k_scale and v_scale")
        kv_scales = (k_scale, v_scale)
    if output is None:
        output = torch.empty_like(query)
    if num_tokens == 0 or num_reqs == 0:
        return output
    if max_query_len <= 1 or not 0 < num_leading_decodes < num_reqs:
        _launch(
            query,
            kv_cache,
            block_tables,
            query_start_loc,
            seq_lens,
            max_query_len,
            scale,
            output,
            config,
            kv_scales,
            launch_num_reqs,
            launch_num_tokens,
        )
        return output
    decodes = slice(0, num_leading_decodes)
    rest = slice(num_leading_decodes, num_reqs)
    _launch(
        query,
        kv_cache,
        block_tables[decodes],
        query_start_loc[: num_leading_decodes + 1],
        seq_lens[decodes],
        1,
        scale,
        output,
        config,
        kv_scales,
    )
    _launch(
        query,
        kv_cache,
        block_tables[rest],
        query_start_loc[num_leading_decodes:],
        seq_lens[rest],
        max_query_len,
        scale,
        output,
        config,
        kv_scales,
    )
    return output


def _launch(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    max_query_len: int,
    scale: float,
    output: torch.Tensor,
    config: LaunchConfig,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    launch_num_reqs: int | None = None,
    launch_num_tokens: int | None = None,
) -> None:
    num_tokens, num_heads, head_dim = query.shape
    num_kv_heads, block_size = kv_cache.shape[3], kv_cache.shape[2]
    num_reqs = seq_lens.shape[0]
    group = num_heads // num_kv_heads
    group_padded = triton.next_power_of_2(group)
    is_decode = max_query_len <= 1
    if is_decode:
        block_m = 1
        block_rows = max(16, group_padded)
        # 128-token steps: 64 KB of K and V in flight per program at head_dim 128 (measured
        # best on an H100 for head_dim 64 and 128; see docs/kernels.md).
        block_n = config.block_n or (128 if head_dim <= 128 else 64)
        num_warps = config.num_warps or 4
        num_stages = config.num_stages or 2
        # Sized by the graph bucket's request count where given, so that eager and replayed
        # steps run the same tile and splits (the same summation order).
        sizing_reqs = max(num_reqs, launch_num_reqs or 0)
        if kv_scales is not None and sizing_reqs * num_kv_heads >= FP8_SMALL_TILE_MIN_PROGRAMS:
            block_n = config.block_n or 32
            num_warps = config.num_warps or 1
        num_splits = config.num_splits or choose_num_splits(sizing_reqs, num_kv_heads, query.device)
        assert num_splits <= MAX_SPLITS, f"at most {MAX_SPLITS} splits, not {num_splits}"
        grid = (num_reqs, num_kv_heads, num_splits)
    else:
        # Rows of a tile are BLOCK_M tokens x the padded group; short queries (speculative
        # tokens, small chunks) get a tile no taller than they need.
        block_rows = config.block_rows or 64
        block_rows = max(
            16, group_padded, min(block_rows, triton.next_power_of_2(max_query_len) * group_padded)
        )
        block_m = block_rows // group_padded
        block_n = config.block_n or 64
        num_warps = config.num_warps or 4
        num_stages = config.num_stages or 2
        num_tiles = num_tokens // block_m + num_reqs
        sizing_tiles = (launch_num_tokens or num_tokens) // block_m + max(
            num_reqs, launch_num_reqs or 0
        )
        num_splits = config.num_splits or choose_num_splits(
            sizing_tiles, num_kv_heads, query.device
        )
        grid = (num_tiles, num_kv_heads, num_splits)

    if num_splits > 1:
        split_output = torch.empty(
            (num_tokens, num_heads, num_splits, head_dim), dtype=torch.float32, device=query.device
        )
        split_lse = torch.empty(
            (num_tokens, num_heads, num_splits), dtype=torch.float32, device=query.device
        )
    else:
        split_output = split_lse = output  # unused
    merge_on_arrival = is_decode
    counters = counter_buffer(query.device) if num_splits > 1 and is_decode else seq_lens
    # Splits merged per load: a [group, chunk, head_dim] float32 tile of at most 8192.
    split_chunk = max(1, min(MAX_SPLITS, 8192 // (group_padded * head_dim)))

    _paged_attention_kernel[grid](
        output,
        query,
        kv_cache[0],
        kv_cache[1],
        block_tables,
        query_start_loc,
        seq_lens,
        split_output,
        split_lse,
        counters,
        kv_scales[0] if kv_scales is not None else seq_lens,  # unused unless KV_FP8
        kv_scales[1] if kv_scales is not None else seq_lens,
        scale * LOG2_E,
        num_reqs,
        num_splits,
        num_heads,
        query.stride(0),
        query.stride(1),
        output.stride(0),
        output.stride(1),
        kv_cache.stride(1),
        kv_cache.stride(2),
        kv_cache.stride(3),
        block_tables.stride(0),
        GROUP=group,
        GROUP_PADDED=group_padded,
        BLOCK_M=block_m,
        BLOCK_ROWS=block_rows,
        BLOCK_N=block_n,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        TILES_ARE_REQUESTS=is_decode,
        IS_SPLIT=num_splits > 1,
        MERGE_ON_ARRIVAL=merge_on_arrival,
        KV_FP8=kv_scales is not None,
        SPLITS_PADDED=MAX_SPLITS,
        SPLIT_CHUNK=split_chunk,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl_launch(query.device, num_reqs, eligible=is_decode),  # the decode chain
    )
    if num_splits > 1 and not merge_on_arrival:
        _merge_split_rows_kernel[(num_tokens, num_kv_heads)](
            output,
            split_output,
            split_lse,
            query_start_loc,
            num_reqs,
            num_heads,
            num_splits,
            output.stride(0),
            output.stride(1),
            GROUP=group,
            GROUP_PADDED=group_padded,
            HEAD_DIM=head_dim,
            SPLITS_PADDED=MAX_SPLITS,
            SPLIT_CHUNK=split_chunk,
        )
