"""Drafted steps planned in flight (worker/drafts_on_device.py) in three launches, not ~75.

The torch path of a drafted step is ~75 small launches (the n-gram lookup ~30, moving a step
back ~14, the verdict ~22): on the GPU the host's time to launch them is most of what a small
model's step costs. Each part here is one launch, one program per request:

- ngram_drafts_: prompt lookup over the request's device history (worker/device_ngram.py's
  rule: the longest common suffix of n in [min_n, max_n], its latest end, k tokens after it,
  the last token where there are fewer), stored straight into the step's input ids;
- move_back_: a request planned behind an unread verify step: its positions, KV slots (from its
  block table), sequence length and sampling counters back by the drafts that step rejected;
- judge_: the verdict after sampling: leading accepted drafts, each row's emitted token, the
  last token, the rejected count, and the emitted tokens onto the history.

Same integer arithmetic as the torch path, so the results are identical (tests/kernels/
test_draft_step_kernels.py under the interpreter, tests/gpu/ on a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ladle.kernels.launch import launch

ROWS = 32  # a request's rows or tokens in a drafted step: k + 1 <= 17
DRAFTS = 16  # config.MAX_SPECULATIVE_TOKENS
ENDS = 256  # n-gram ends compared per loop iteration


# Per-step values stay out of Triton's specialisation keys (kernels/compile_log.py): the n-gram
# width changes every step (divisible by 16 at some steps, not at others) and the pointers may
# be views at any offset, and each new key is a build while serving, in series with the GPU.
@triton.jit(
    do_not_specialize=["history_stride", "width", "min_n"],
    do_not_specialize_on_alignment=[
        "history_ptr", "lengths_ptr", "slots_ptr", "first_tokens_ptr", "counts_ptr",
        "input_ids_ptr",
    ],
)
def _ngram_kernel(
    history_ptr,
    history_stride,
    lengths_ptr,
    slots_ptr,
    first_tokens_ptr,
    counts_ptr,
    input_ids_ptr,
    width,
    min_n,
    MAX_N: tl.constexpr,
    ENDS: tl.constexpr,
    DRAFTS: tl.constexpr,
):
    request = tl.program_id(0)
    slot = tl.load(slots_ptr + request)
    row = history_ptr + slot * history_stride + MAX_N  # token i at row + i; -1 before 0
    last = tl.load(lengths_ptr + slot) - 1
    best = tl.full([ENDS], -1, tl.int64)
    for start in range(0, width + 1, ENDS):
        ends = start + tl.arange(0, ENDS).to(tl.int64)
        is_end = ends <= last
        common = tl.zeros([ENDS], tl.int64)
        run = is_end
        for back in tl.static_range(1, MAX_N + 1):
            window = tl.load(row + ends - back, mask=is_end, other=-2)
            suffix = tl.load(row + last + 1 - back)
            run = run & (window == suffix)
            common += run.to(tl.int64)
        common = tl.minimum(common, last)
        valid = is_end & (common >= min_n)
        best = tl.maximum(best, tl.where(valid, common * (width + 1) + ends, -1))
    found = tl.max(best, axis=0)
    first = tl.where(found >= 0, found % (width + 1), last)
    offsets = tl.arange(0, DRAFTS)
    count = tl.load(counts_ptr + request)
    drafts = tl.load(row + tl.minimum(first + offsets, last), mask=offsets < count, other=0)
    first_token = tl.load(first_tokens_ptr + request)
    tl.store(input_ids_ptr + first_token + offsets, drafts, mask=offsets < count)


def ngram_drafts_(
    history: torch.Tensor,
    lengths: torch.Tensor,
    slots: torch.Tensor,
    first_tokens: torch.Tensor,
    counts: torch.Tensor,
    input_ids: torch.Tensor,
    width: int,
    min_n: int,
    max_n: int,
) -> None:
    """Each drafting request's drafts (slots[i]'s history, counts[i] of them) into input_ids
    from index first_tokens[i]; width: the tokens any of them can have."""
    launch(
        _ngram_kernel,
        (slots.shape[0],),
        history, history.stride(0), lengths, slots, first_tokens, counts, input_ids,
        width, min_n, MAX_N=max_n, ENDS=ENDS, DRAFTS=DRAFTS,
    )  # fmt: skip


@triton.jit(
    do_not_specialize=["block_table_stride", "block_size"],
    do_not_specialize_on_alignment=[
        "rejected_ptr", "request_slots_ptr", "shifted_ptr", "query_start_ptr", "row_first_ptr",
        "row_count_ptr", "block_table_ptr", "positions_ptr", "slot_mapping_ptr", "seq_lens_ptr",
        "steps_ptr",
    ],
)
def _move_back_kernel(
    rejected_ptr,
    request_slots_ptr,
    shifted_ptr,
    query_start_ptr,
    row_first_ptr,
    row_count_ptr,
    block_table_ptr,
    block_table_stride,
    block_size,
    positions_ptr,
    slot_mapping_ptr,
    seq_lens_ptr,
    steps_ptr,
    ROWS: tl.constexpr,
):
    request = tl.program_id(0)
    shifted = (tl.load(shifted_ptr + request) != 0).to(tl.int64)  # 1 or 0: nothing moves
    slot = tl.load(request_slots_ptr + request)
    back = tl.load(rejected_ptr + slot) * shifted
    start = tl.load(query_start_ptr + request).to(tl.int64)
    end = tl.load(query_start_ptr + request + 1).to(tl.int64)
    offsets = tl.arange(0, ROWS)
    is_token = offsets < (end - start) * shifted
    tokens = start + offsets
    positions = tl.load(positions_ptr + tokens, mask=is_token, other=0) - back
    tl.store(positions_ptr + tokens, positions, mask=is_token)
    table = block_table_ptr + slot * block_table_stride
    blocks = tl.load(table + positions // block_size, mask=is_token, other=0).to(tl.int64)
    tl.store(slot_mapping_ptr + tokens, blocks * block_size + positions % block_size, mask=is_token)
    seq_len = tl.load(seq_lens_ptr + request)
    tl.store(seq_lens_ptr + request, seq_len - back.to(seq_len.dtype))
    row_first = tl.load(row_first_ptr + request)
    is_row = offsets < tl.load(row_count_ptr + request) * shifted
    steps = tl.load(steps_ptr + row_first + offsets, mask=is_row, other=0)
    tl.store(steps_ptr + row_first + offsets, steps - back.to(steps.dtype), mask=is_row)


def move_back_(
    rejected: torch.Tensor,
    request_slots: torch.Tensor,
    shifted: torch.Tensor,
    query_start_loc: torch.Tensor,
    row_first: torch.Tensor,
    row_count: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    seq_lens: torch.Tensor,
    steps: torch.Tensor,
) -> None:
    """Move each shifted request's step back by rejected[its slot], in place (every request
    of the step has a program; the others change nothing)."""
    launch(
        _move_back_kernel,
        (request_slots.shape[0],),
        rejected, request_slots, shifted, query_start_loc, row_first, row_count, block_table,
        block_table.stride(0), block_size, positions, slot_mapping, seq_lens, steps, ROWS=ROWS,
    )  # fmt: skip


@triton.jit(
    do_not_specialize=["acceptance", "history_stride", "margin"],
    do_not_specialize_on_alignment=[
        "sampled_ptr", "input_ids_ptr", "row_draft_index_ptr", "first_rows_ptr",
        "num_drafts_ptr", "request_slots_ptr", "coins_ptr", "row_tokens_ptr",
        "num_accepted_ptr", "last_sampled_ptr", "rejected_ptr", "history_ptr", "lengths_ptr",
    ],
)
def _judge_kernel(
    sampled_ptr,
    input_ids_ptr,
    row_draft_index_ptr,
    first_rows_ptr,
    num_drafts_ptr,
    request_slots_ptr,
    coins_ptr,
    acceptance,
    row_tokens_ptr,
    num_accepted_ptr,
    last_sampled_ptr,
    rejected_ptr,
    history_ptr,
    history_stride,
    margin,
    lengths_ptr,
    SYNTHETIC: tl.constexpr,
    ROWS: tl.constexpr,
):
    request = tl.program_id(0)
    first = tl.load(first_rows_ptr + request)
    drafts = tl.load(num_drafts_ptr + request)
    slot = tl.load(request_slots_ptr + request)
    offsets = tl.arange(0, ROWS)
    is_row = offsets <= drafts
    rows = first + offsets
    sampled = tl.load(sampled_ptr + rows, mask=is_row, other=0)
    has_draft = offsets < drafts
    draft_index = tl.load(row_draft_index_ptr + rows, mask=has_draft, other=0)
    row_drafts = tl.load(input_ids_ptr + draft_index, mask=has_draft, other=-1).to(tl.int64)
    if SYNTHETIC:
        coins = tl.load(coins_ptr + rows, mask=has_draft, other=1.0)
        accepts = has_draft & (coins < acceptance)
    else:
        accepts = has_draft & (sampled == row_drafts)
    # The first row that does not accept (at the latest the bonus row, which has no draft).
    num_accepted = tl.min(tl.where(accepts | (offsets > drafts), ROWS, offsets), axis=0)
    tokens = tl.where(offsets < num_accepted, row_drafts, sampled)
    tl.store(row_tokens_ptr + rows, tokens, mask=is_row)
    tl.store(num_accepted_ptr + request, num_accepted.to(tl.int64))
    bonus = tl.sum(tl.where(offsets == num_accepted, sampled, 0), axis=0)
    tl.store(last_sampled_ptr + slot, bonus)
    tl.store(rejected_ptr + slot, (drafts - num_accepted).to(tl.int64))
    length = tl.load(lengths_ptr + slot)
    history = history_ptr + slot * history_stride + margin + length
    tl.store(history + offsets, tokens.to(tl.int32), mask=offsets <= num_accepted)
    tl.store(lengths_ptr + slot, length + num_accepted + 1)


def judge_(
    words: torch.Tensor,
    sampled: torch.Tensor,
    input_ids: torch.Tensor,
    row_draft_index: torch.Tensor,
    first_rows: torch.Tensor,
    num_drafts: torch.Tensor,
    request_slots: torch.Tensor,
    coins: torch.Tensor | None,
    acceptance: float,
    last_sampled: torch.Tensor,
    rejected: torch.Tensor,
    history: torch.Tensor,
    margin: int,
    lengths: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The verdict of a sampled step (module docstring): returns (each row's emitted token,
    each request's accepted drafts), views of words ([rows + requests] int64, the rows first:
    the host reads both with one copy); writes the slots' last token, rejected count, history
    and length. coins: each row's synthetic coin (None: drafts are checked against the rows)."""
    num_rows = sampled.shape[0]
    row_tokens, num_accepted = words[:num_rows], words[num_rows : num_rows + first_rows.shape[0]]
    launch(
        _judge_kernel,
        (first_rows.shape[0],),
        sampled, input_ids, row_draft_index, first_rows, num_drafts, request_slots,
        coins if coins is not None else sampled, acceptance, row_tokens, num_accepted,
        last_sampled, rejected, history, history.stride(0), margin, lengths,
        SYNTHETIC=coins is not None, ROWS=ROWS,
    )  # fmt: skip
    return row_tokens, num_accepted
