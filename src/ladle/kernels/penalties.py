"""Repetition / frequency / presence penalties in two launches instead of ~15.

One launch scatters the padded prompt and output token ids into an int32 [num_reqs, vocab + 1]
tally (column vocab soaks up the padding, as in sample/penalties.py): each output occurrence
adds 2, a prompt occurrence sets bit 0 (atomic or), so tally >> 1 is the output count and
tally != 0 means seen. A second launch reads logits and tally once and applies the three
penalties in place with the torch path's exact operations and rounding (IEEE division, no
mul+add contraction), so penalised logits are bit-identical.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_TALLY_BLOCK = 1024


@triton.jit(do_not_specialize=["width", "stride_ids"])
def _tally_kernel(
    tally_ptr,
    token_ids_ptr,
    width,
    stride_ids,
    stride_tally,
    IS_OUTPUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    columns = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    is_column = columns < width
    token_ids = tl.load(token_ids_ptr + row * stride_ids + columns, mask=is_column, other=0)
    pointers = tally_ptr + row * stride_tally + token_ids.to(tl.int64)
    if IS_OUTPUT:
        tl.atomic_add(pointers, tl.full([BLOCK], 2, tl.int32), mask=is_column, sem="relaxed")
    else:
        tl.atomic_or(pointers, tl.full([BLOCK], 1, tl.int32), mask=is_column, sem="relaxed")


@triton.jit(
    do_not_specialize_on_alignment=["presence_ptr", "frequency_ptr", "repetition_ptr"],
)
def _apply_penalties_kernel(
    logits_ptr,
    tally_ptr,
    presence_ptr,
    frequency_ptr,
    repetition_ptr,
    vocab_size,
    stride_logits,
    stride_tally,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    is_token = tokens < vocab_size
    tally = tl.load(tally_ptr + row * stride_tally + tokens, mask=is_token, other=0)
    pointers = logits_ptr + row * stride_logits + tokens
    logits = tl.load(pointers, mask=is_token, other=0.0)
    repetition = tl.load(repetition_ptr + row).to(tl.float32)
    frequency = tl.load(frequency_ptr + row).to(tl.float32)
    presence = tl.load(presence_ptr + row).to(tl.float32)
    repeated = tl.where(logits > 0, tl.math.div_rn(logits, repetition), logits * repetition)
    logits = tl.where(tally != 0, repeated, logits)
    count = (tally >> 1).to(tl.float32)
    logits = logits - frequency * count
    logits = logits - presence * (count > 0).to(tl.float32)
    tl.store(pointers, logits, mask=is_token)


def apply_penalties_(
    logits: torch.Tensor,
    prompt_token_ids: torch.Tensor,
    output_token_ids: torch.Tensor,
    presence_penalty: torch.Tensor,
    frequency_penalty: torch.Tensor,
    repetition_penalty: torch.Tensor,
) -> torch.Tensor:
    """sample.penalties.apply_penalties_ for float32 CUDA logits [num_reqs, vocab], in place."""
    num_reqs, vocab_size = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1
    if num_reqs == 0:
        return logits
    tally = torch.zeros(num_reqs, vocab_size + 1, dtype=torch.int32, device=logits.device)
    for token_ids, is_output in ((prompt_token_ids, False), (output_token_ids, True)):
        token_ids = token_ids if token_ids.stride(-1) == 1 else token_ids.contiguous()
        width = token_ids.shape[1]
        # One tile width for every step (masked lanes cost next to nothing), so a long prompt
        # does not compile a new variant under its first user.
        block = _TALLY_BLOCK
        _tally_kernel[(num_reqs, triton.cdiv(width, block))](
            tally,
            token_ids,
            width,
            token_ids.stride(0),
            tally.stride(0),
            IS_OUTPUT=is_output,
            BLOCK=block,
        )
    block = 2048
    _apply_penalties_kernel[(num_reqs, triton.cdiv(vocab_size, block))](
        logits,
        tally,
        presence_penalty,
        frequency_penalty,
        repetition_penalty,
        vocab_size,
        logits.stride(0),
        tally.stride(0),
        BLOCK=block,
        num_warps=8,
        enable_fp_fusion=False,
    )
    return logits
