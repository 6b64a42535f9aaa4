"""The CUDA path of apply_token_bitmask: one Triton launch over (constrained row, vocab block)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_SIZE = 4096


@triton.jit
def _apply_token_bitmask_kernel(
    logits_ptr,
    logits_row_stride,
    bitmask_ptr,
    bitmask_row_stride,
    row_indices_ptr,
    row_indices_stride,
    vocab_size,
    BLOCK: tl.constexpr,
):
    mask_row = tl.program_id(0)
    block = tl.program_id(1)
    logits_row = tl.load(row_indices_ptr + mask_row * row_indices_stride).to(tl.int64)
    tokens = block * BLOCK + tl.arange(0, BLOCK)
    in_vocab = tokens < vocab_size
    words = tl.load(
        bitmask_ptr + mask_row * bitmask_row_stride + tokens // 32, mask=in_vocab, other=-1
    )
    allowed = (words >> (tokens % 32)) & 1
    # Store only where forbidden: the logits themselves are never read.
    tl.store(
        logits_ptr + logits_row * logits_row_stride + tokens,
        tl.full([BLOCK], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty),
        mask=in_vocab & (allowed == 0),
    )


def apply_token_bitmask_triton(
    logits: torch.Tensor, bitmask: torch.Tensor, row_indices: torch.Tensor
) -> None:
    assert logits.stride(-1) == 1 and bitmask.stride(-1) == 1, "rows must be contiguous"
    vocab_size = logits.shape[-1]
    grid = (bitmask.shape[0], triton.cdiv(vocab_size, BLOCK_SIZE))
    _apply_token_bitmask_kernel[grid](
        logits,
        logits.stride(0),
        bitmask,
        bitmask.stride(0),
        row_indices,
        row_indices.stride(0),
        vocab_size,
        BLOCK=BLOCK_SIZE,
    )
