"""Prompt lookup (n-gram drafting) on the device, over a device copy of each request's tokens.

The host's NgramIndex (spec_decode/ngram.py) reads every token on the host, so a request it
drafts for waits for its step to be read. This one reads the tokens where the worker keeps them
on the device (worker/drafts_on_device.py), so the step that verifies the drafts can be planned
while the step before it runs. The rule is the host's: the longest n in [min_n, max_n] whose
last n tokens occurred earlier (ending before the last token, so the suffix never matches
itself), its most recent occurrence, and the k tokens that followed it there. Where there is no
match, or the continuation runs past the known tokens, the draft repeats the last token: any
draft is exact (the verifier rejects wrong ones), and a fixed count keeps the step's shape
known to the host that planned it.

Vectorised over the requests and the history: for each n one comparison of every window of n
tokens with the suffix ([requests, width, n]), no per-request loop and no host sync.
"""

from __future__ import annotations

import torch


def ngram_drafts(
    history: torch.Tensor,
    lengths: torch.Tensor,
    num_drafts: int,
    min_n: int,
    max_n: int,
) -> torch.Tensor:
    """Drafts [requests, num_drafts] (int64) from each request's tokens.

    history: [requests, width] int, each row's first lengths[i] entries its tokens (width: at
    least the longest row, the rest ignored); lengths: [requests] int64, each >= 1."""
    num_rows, width = history.shape
    device = history.device
    lengths = lengths.long()
    last_index = lengths - 1
    best_end = torch.full((num_rows,), -1, dtype=torch.long, device=device)
    for n in range(min(max_n, width - 1), min_n - 1, -1):
        suffix_index = (lengths[:, None] - n + torch.arange(n, device=device)).clamp(min=0)
        suffix = history.gather(1, suffix_index)  # [requests, n]
        windows = history.unfold(1, n, 1)  # [requests, width - n + 1, n]; ends at start + n
        matches = (windows == suffix[:, None, :]).all(dim=-1)
        ends = torch.arange(n, width + 1, device=device)
        valid = matches & (ends[None, :] <= last_index[:, None]) & (lengths > n)[:, None]
        latest = torch.where(valid, ends[None, :], -1).amax(dim=1)
        best_end = torch.where(best_end < 0, latest, best_end)
    last_token = history.gather(1, last_index.clamp(min=0)[:, None])
    draft_index = best_end[:, None] + torch.arange(num_drafts, device=device)
    known = (best_end[:, None] >= 0) & (draft_index <= last_index[:, None])
    continuation = history.gather(1, draft_index.clamp(0, width - 1))
    return torch.where(known, continuation, last_token).long()
