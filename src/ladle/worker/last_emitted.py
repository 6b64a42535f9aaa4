"""Each request's last token after a step, into its slot of the persistent batch's device copy
(`last_sampled`), where a later step reads its input id when the host does not know it yet.

A plain step samples one row a request: its token is the request's last. A step that verifies
drafts samples 1 + k rows a request, and the request goes on from the token verification
emitted last: the first row whose token differs from the draft it checks, or the bonus row
(sample/rejection.py's emitted_tokens walks the same rows on the host). Copying every row into
the slot would leave whichever row was written last: a rank or stage that read that id (a
tensor-parallel rank that launched the next step before reading this one's result, a pipeline
stage before the last) then ran the next step from another token than the others.

Done on the device (no host sync): the drafts and row layout are the host's already.
"""

from __future__ import annotations

import torch


def write_last_tokens(
    last_sampled: torch.Tensor,
    sampled: torch.Tensor,
    row_slots: torch.Tensor,
    rows: list[tuple[int, int]],
    drafts: list[list[int]],
) -> None:
    """sampled: [num_rows] each row's token; row_slots: [num_rows] each row's request slot;
    rows: (request position, drafts before the row) in row order, a request's rows
    consecutive; drafts: each scheduled request's draft ids (host-made)."""
    if not any(drafts):
        last_sampled.index_copy_(0, row_slots, sampled)
        return
    device = sampled.device
    # Per row: the draft it checks (-1 for a bonus row: no token equals it), its offset in its
    # request's rows, and which of the step's sampling requests it belongs to.
    checked, offsets, request_of_row, first_rows = [], [], [], []
    previous = None
    for row, (position, offset) in enumerate(rows):
        if position != previous:
            first_rows.append(row)
            previous = position
        request_drafts = drafts[position]
        checked.append(request_drafts[offset] if offset < len(request_drafts) else -1)
        offsets.append(offset)
        request_of_row.append(len(first_rows) - 1)
    num_rows = len(rows)
    checked_t = torch.tensor(checked, dtype=sampled.dtype, device=device)
    offsets_t = torch.tensor(offsets, dtype=torch.int64, device=device)
    request_t = torch.tensor(request_of_row, dtype=torch.int64, device=device)
    first_t = torch.tensor(first_rows, dtype=torch.int64, device=device)
    # The first refusing row of each request (its bonus row refuses always).
    refusing = torch.where(sampled != checked_t, offsets_t, num_rows)
    stop = torch.full((len(first_rows),), num_rows, dtype=torch.int64, device=device)
    stop.scatter_reduce_(0, request_t, refusing, reduce="amin")
    last_rows = first_t + stop
    last_sampled.index_copy_(0, row_slots[first_t], sampled[last_rows])
