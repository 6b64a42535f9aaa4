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

    history: [requests, max_n + width] int: max_n columns of -1 (never a token id: every end
    then has max_n entries before it), then each row's lengths[i] tokens (width: at least the
    longest row, the rest ignored); lengths: [requests] int64, each >= 1."""
    width = history.shape[1] - max_n
    device = history.device
    last_index = lengths - 1
    windows = history.unfold(1, max_n, 1)  # [requests, width + 1, max_n]: window e, [e-max_n, e)
    suffix = history.gather(1, lengths[:, None] + arange(max_n, device))
    equal = windows == suffix[:, None, :]
    # The common suffix's length: a running AND from each window's last token backwards.
    run = equal[..., max_n - 1].long()
    common = run
    for back in range(2, max_n + 1):
        run = run * equal[..., max_n - back]
        common = common + run
    # The host's rule: n <= length - 1, the match ends before the last token, n >= min_n.
    common = torch.minimum(common, last_index[:, None])
    ends = arange(width + 1, device)
    valid = (common >= min_n) & (ends[None, :] <= last_index[:, None])
    score = torch.where(valid, common * (width + 1) + ends[None, :], -1).amax(dim=1)
    # No match: the draft starts at the last token, and every index past it reads the last
    # token again (the padding of the module docstring).
    start = torch.where(score >= 0, score % (width + 1), last_index)
    index = torch.minimum(start[:, None] + arange(num_drafts, device), last_index[:, None])
    return history.gather(1, index + max_n).long()


_ARANGES: dict[torch.device, torch.Tensor] = {}


def arange(size: int, device: torch.device) -> torch.Tensor:
    """torch.arange(size) on the device: a view of one kept per device (grown by doubling),
    so a step's index ranges cost no launch."""
    kept = _ARANGES.get(device)
    if kept is None or kept.shape[0] < size:
        grown = max(size, 64, 0 if kept is None else 2 * kept.shape[0])
        kept = _ARANGES[device] = torch.arange(grown, device=device)
    return kept[:size]
