"""apply_token_bitmask: forbid, in one launch for the batch, the tokens a grammar disallows.

The bitmask holds one row of int32 words per constrained request: bit (t % 32) of word (t // 32)
is set when token t is allowed. Only the constrained rows are touched (row_indices names them in
the logits), so a batch where a quarter of the rows follow a grammar pays for that quarter and an
unconstrained batch pays nothing: the caller passes no bitmask at all.

On CUDA it is one Triton kernel that only stores -inf where a bit is clear (the logits are never
read); elsewhere the same thing as a few torch ops. `reference_apply_token_bitmask` is the plain
per-token loop both are tested against.
"""

from __future__ import annotations

import torch

BITS_PER_WORD = 32


def bitmask_width(vocab_size: int) -> int:
    """int32 words per row for a vocabulary of vocab_size tokens."""
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, row_indices: torch.Tensor
) -> None:
    """In place: logits[row_indices[i], t] = -inf wherever bit t of bitmask[i] is clear.

    logits: [num_rows, vocab] float; bitmask: [num_constrained, >= bitmask_width(vocab)] int32;
    row_indices: [num_constrained] integer, on the logits' device. Columns past the bitmask's
    bits (none when it is wide enough) would be left alone, so the width is checked.
    """
    if bitmask.shape[0] == 0:
        return
    vocab_size = logits.shape[-1]
    if bitmask.shape[1] * BITS_PER_WORD < vocab_size:
        raise ValueError(
            f"bitmask has {bitmask.shape[1]} words per row, too few for {vocab_size} logits"
        )
    if bitmask.shape[0] != row_indices.shape[0]:
        raise ValueError("bitmask and row_indices must have one row per constrained request")
    if logits.is_cuda:
        # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
        # triton; tests/model/test_fused_kernel_dispatch.py).
        from ladle.structured.bitmask_triton import apply_token_bitmask_triton

        apply_token_bitmask_triton(logits, bitmask, row_indices)
        return
    _apply_token_bitmask_torch(logits, bitmask, row_indices)


def _apply_token_bitmask_torch(
    logits: torch.Tensor, bitmask: torch.Tensor, row_indices: torch.Tensor
) -> None:
    vocab_size = logits.shape[-1]
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [k, words, 32]
    forbidden = bits.reshape(bitmask.shape[0], -1)[:, :vocab_size] == 0
    rows = row_indices.long()
    logits[rows] = logits[rows].masked_fill(forbidden.to(logits.device), float("-inf"))


def reference_apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, row_indices: torch.Tensor
) -> torch.Tensor:
    """The plain definition, token by token (tests only): a masked copy of logits."""
    result = logits.clone()
    words = bitmask.cpu().tolist()
    for mask_row, logits_row in enumerate(row_indices.cpu().tolist()):
        for token in range(logits.shape[-1]):
            word = words[mask_row][token // BITS_PER_WORD] & 0xFFFFFFFF
            if not (word >> (token % BITS_PER_WORD)) & 1:
                result[logits_row, token] = float("-inf")
    return result
