"""A prefill graph's inputs for one replay, written in one launch (worker/prefill_graphs.py).

Before a prefill graph replays, its static buffers take the step's token ids, positions, cache
slots, query offsets, context lengths and block-table rows, and the bucket's padding: padding
tokens (id 0, position 0, slot 0 of the null block) and padding requests that share the padding
tokens evenly, each a context of its own tokens, with all-zero block-table rows. As torch calls
that is 14 launches a step, each 8-15 us of the host's time on an H200 machine: the largest
part of what a speculative verify step (which replays such a graph at every drafted step) cost
the host beyond a decode step's 63 us (381 us, docs/benchmarks.md, session 47). One launch here.

Programs [0, token programs) copy BLOCK_T tokens each (the padding past num_tokens); the
programs after them own one request row each: its query offset, context length and block-table
row (copied up to the step's width, or zeroed whole for a padding request). The torch reference
is PrefillGraphs.fill_inputs_with_torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ladle.kernels.launch import launch

BLOCK_T = 1024  # tokens a program
BLOCK_W = 512  # block-table columns a loop trip


# Every count varies step by step: keep them out of the compiled variants' keys, as the views'
# alignment (kernels/compile_log.py: no builds while serving).
@triton.jit(
    do_not_specialize=[
        "num_tokens", "padded_tokens", "num_reqs", "padded_reqs", "width", "pad_base",
        "pad_extra", "num_token_programs", "stride_source_table",
    ],
    do_not_specialize_on_alignment=[
        "source_ids_ptr", "source_positions_ptr", "source_slots_ptr", "source_starts_ptr",
        "source_lengths_ptr", "source_table_ptr",
    ],
)
def _fill_prefill_inputs_kernel(
    source_ids_ptr,
    source_positions_ptr,
    source_slots_ptr,
    source_starts_ptr,
    source_lengths_ptr,
    source_table_ptr,
    ids_ptr,
    positions_ptr,
    slots_ptr,
    starts_ptr,
    lengths_ptr,
    table_ptr,
    num_tokens,
    padded_tokens,
    num_reqs,
    padded_reqs,
    width,
    pad_base,
    pad_extra,
    num_token_programs,
    stride_source_table,
    stride_table,
    table_width,
    BLOCK_T: tl.constexpr,
    BLOCK_W: tl.constexpr,
):
    program = tl.program_id(0)
    if program < num_token_programs:
        tokens = program * BLOCK_T + tl.arange(0, BLOCK_T)
        is_real = tokens < num_tokens
        in_bucket = tokens < padded_tokens
        ids = tl.load(source_ids_ptr + tokens, mask=is_real, other=0)
        positions = tl.load(source_positions_ptr + tokens, mask=is_real, other=0)
        slots = tl.load(source_slots_ptr + tokens, mask=is_real, other=0)
        tl.store(ids_ptr + tokens, ids.to(ids_ptr.dtype.element_ty), mask=in_bucket)
        positions = positions.to(positions_ptr.dtype.element_ty)
        tl.store(positions_ptr + tokens, positions, mask=in_bucket)
        tl.store(slots_ptr + tokens, slots.to(slots_ptr.dtype.element_ty), mask=in_bucket)
        return
    row = program - num_token_programs
    columns = tl.arange(0, BLOCK_W)
    table_row = table_ptr + row.to(tl.int64) * stride_table
    if row < num_reqs:
        tl.store(starts_ptr + row, tl.load(source_starts_ptr + row))
        tl.store(lengths_ptr + row, tl.load(source_lengths_ptr + row))
        source_row = source_table_ptr + row.to(tl.int64) * stride_source_table
        for first in range(0, width, BLOCK_W):
            is_column = first + columns < width
            blocks = tl.load(source_row + first + columns, mask=is_column, other=0)
            tl.store(table_row + first + columns, blocks, mask=is_column)
    else:
        # Padding request j starts at num_tokens + j * base + min(j, extra): the first `extra`
        # of them take one token more.
        pad = row - num_reqs
        start = num_tokens + pad * pad_base + tl.minimum(pad, pad_extra)
        tl.store(starts_ptr + row, start)
        tl.store(lengths_ptr + row, pad_base + (pad < pad_extra).to(tl.int32))
        for first in range(0, table_width, BLOCK_W):
            is_column = first + columns < table_width
            tl.store(table_row + first + columns, tl.zeros([BLOCK_W], tl.int32), mask=is_column)
    if row == padded_reqs - 1:
        tl.store(starts_ptr + padded_reqs, padded_tokens)


def fill_prefill_inputs(
    static_ids: torch.Tensor,
    static_positions: torch.Tensor,
    static_slots: torch.Tensor,
    static_starts: torch.Tensor,
    static_lengths: torch.Tensor,
    static_tables: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    padded_tokens: int,
    padded_reqs: int,
) -> None:
    """Write one step into a prefill bucket's static buffers (module docstring): the step's
    num_tokens tokens and num_reqs requests, then padding up to padded_tokens and padded_reqs
    (at least one padding request, each of at least one token). The static block table is
    contiguous, as wide as the graphs' max_blocks_per_seq."""
    num_tokens = input_ids.shape[0]
    num_reqs = seq_lens.shape[0]
    num_pads = padded_reqs - num_reqs
    assert num_pads >= 1 and padded_tokens - num_tokens >= num_pads
    assert static_tables.is_contiguous() and block_tables.stride(1) == 1
    pad_base, pad_extra = divmod(padded_tokens - num_tokens, num_pads)
    num_token_programs = triton.cdiv(padded_tokens, BLOCK_T)
    launch(
        _fill_prefill_inputs_kernel,
        (num_token_programs + padded_reqs,),
        input_ids,
        positions,
        slot_mapping,
        query_start_loc,
        seq_lens,
        block_tables,
        static_ids,
        static_positions,
        static_slots,
        static_starts,
        static_lengths,
        static_tables,
        num_tokens,
        padded_tokens,
        num_reqs,
        padded_reqs,
        block_tables.shape[1],
        pad_base,
        pad_extra,
        num_token_programs,
        block_tables.stride(0),
        static_tables.stride(0),
        static_tables.shape[1],
        BLOCK_T=BLOCK_T,
        BLOCK_W=BLOCK_W,
    )
