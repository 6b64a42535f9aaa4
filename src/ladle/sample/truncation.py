"""min-p, top-k and top-p: mask the tokens a request may not sample, per row, without a loop.

All three set logits to -inf in place and never remove a row's most likely token, so every row
keeps at least one token whatever its settings.
"""

from __future__ import annotations

import torch


def apply_min_p_(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the row's top probability.

    Done in log space (logit < max logit + log(min_p)), which needs no softmax; min_p = 0 gives
    log(0) = -inf, a threshold nothing falls below.
    """
    threshold = logits.amax(dim=-1, keepdim=True) + torch.log(min_p.to(logits.dtype))[:, None]
    return logits.masked_fill_(logits < threshold, float("-inf"))


def apply_top_k_top_p_(
    logits: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    *,
    apply_top_k: bool = True,
    apply_top_p: bool = True,
    max_top_k: int = 0,
) -> torch.Tensor:
    """Keep each row's top_k tokens, then the smallest prefix of them holding top_p of the mass.

    One stable descending sort serves both: top-k masks sorted positions >= k (k = 0, or k at
    least the vocabulary, keeps all), top-p renormalises what top-k kept and drops a token once
    the mass of the tokens strictly before it reaches top_p, so the first token always stays. A
    row with top_p = 1 is left alone rather than trusting a float cumsum to stay below 1. The
    stable sort keeps tie-breaking, and so the kept set, independent of the batch.

    max_top_k (the largest top_k of the rows that set one, 0 if unknown): with top-k alone and a
    small enough max_top_k, the same set is found without the sort (_apply_top_k_by_selection_).
    """
    vocab_size = logits.shape[-1]
    if apply_top_k and not apply_top_p and 0 < max_top_k <= _max_selection_width(vocab_size):
        return _apply_top_k_by_selection_(logits, top_k, max_top_k)
    sorted_logits, sorted_ids = torch.sort(logits, dim=-1, descending=True, stable=True)
    if apply_top_k:
        k = top_k.to(torch.int64)
        k = torch.where((k <= 0) | (k > vocab_size), vocab_size, k)
        positions = torch.arange(vocab_size, device=logits.device)
        sorted_logits.masked_fill_(positions[None, :] >= k[:, None], float("-inf"))
    if apply_top_p:
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1).sub_(probs)
        threshold = top_p.to(probs.dtype)[:, None]
        sorted_logits.masked_fill_((mass_before >= threshold) & (threshold < 1.0), float("-inf"))
    return logits.scatter_(1, sorted_ids, sorted_logits)


def _max_selection_width(vocab_size: int) -> int:
    # torch.topk stays a single radix-select pass well past a thousand; past that, or for a
    # large share of a small vocabulary, the sort is as cheap.
    return min(1024, vocab_size // 4)


def _apply_top_k_by_selection_(
    logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int
) -> torch.Tensor:
    """The stable-sort top-k of apply_top_k_top_p_, without sorting the vocabulary.

    Each row's k-th largest value comes from one top-k selection of width max_top_k. Tokens above
    it are kept; of the tokens equal to it, the lowest ids fill the remaining places, which is
    the order a stable descending sort gives ties (bf16 logits tie often). Rows whose k is
    disabled (<= 0 or at least the vocabulary) keep everything; max_top_k must cover every other
    row's k (rows above it are clamped to it: only greedy rows, whose draw is discarded).
    """
    vocab_size = logits.shape[-1]
    k = top_k.to(torch.int64)
    keeps_all = (k <= 0) | (k >= vocab_size)
    k = k.clamp(1, max_top_k)[:, None]
    kth_value = logits.topk(max_top_k, dim=-1, sorted=True).values.gather(1, k - 1)
    is_above = logits > kth_value
    is_tied = logits == kth_value
    room_for_ties = k - is_above.sum(dim=-1, keepdim=True)
    keep = is_above | (is_tied & (is_tied.cumsum(dim=-1, dtype=torch.int32) <= room_for_ties))
    keep |= keeps_all[:, None]
    return logits.masked_fill_(~keep, float("-inf"))
