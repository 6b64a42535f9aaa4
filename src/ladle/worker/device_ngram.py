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

Vectorised over the requests and the history, in one pass for every n: each window of max_n
tokens is compared with the last max_n tokens ([requests, width, max_n]), the length of their
common suffix found by a running AND from the window's end, and the best end scored as
(length, end), so the longest match wins and the latest among equals. No per-request loop, no
host sync, a fixed number of launches.
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
    width = history.shape[1]
    device = history.device
    lengths = lengths.long()
    last_index = lengths - 1
    # Left padding (never a token id) so that every end in [0, width] has max_n tokens before
    # it: window e covers the tokens [e - max_n, e).
    padded = torch.nn.functional.pad(history, (max_n, 0), value=-1)
    windows = padded.unfold(1, max_n, 1)  # [requests, width + 1, max_n]
    suffix = padded.gather(1, lengths[:, None] + torch.arange(max_n, device=device))
    equal = windows == suffix[:, None, :]
    # The common suffix's length: a running AND from each window's last token backwards.
    run = equal[..., max_n - 1].long()
    common = run.clone()
    for back in range(2, max_n + 1):
        run = run * equal[..., max_n - back]
        common += run
    # The host's rule: n <= length - 1, the match ends before the last token, n >= min_n.
    common = torch.minimum(common, last_index[:, None])
    ends = torch.arange(width + 1, device=device)
    valid = (common >= min_n) & (ends[None, :] <= last_index[:, None])
    score = torch.where(valid, common * (width + 1) + ends[None, :], -1).amax(dim=1)
    best_end = torch.where(score >= 0, score % (width + 1), -1)
    last_token = history.gather(1, last_index.clamp(min=0)[:, None])
    draft_index = best_end[:, None] + torch.arange(num_drafts, device=device)
    known = (best_end[:, None] >= 0) & (draft_index <= last_index[:, None])
    continuation = history.gather(1, draft_index.clamp(0, width - 1))
    return torch.where(known, continuation, last_token).long()
