"""Per-request logit edits that requests ask for by token id: logit_bias, allowed_token_ids
and bad_words (as token sequences, sample/bad_words.py).

One step, applied by the Sampler at one point (after the min_tokens bans, before penalties and
greedy/random selection), so later features that edit logits (a grammar bitmask) sit beside it.
The edits are sparse: only rows and token ids that requests name are touched, as a few
index_put / masked_fill calls on the device, with no per-request Python at sampling time.

    edits = build_logit_edits(params, vocab_size)    # None when no request asks for any
    apply_logit_edits_(logits, edits)                # in place
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ladle.sample.bad_words import banned_by_bad_words
from ladle.sampling.params import SamplingParams


@dataclass
class LogitEdits:
    """Sparse edits for one batch (host tensors until `to`)."""

    bias_rows: torch.Tensor | None = None  # [num_biases] row of each (row, token) bias
    bias_token_ids: torch.Tensor | None = None  # [num_biases]
    bias_values: torch.Tensor | None = None  # [num_biases] float32, added to the logit
    allowed_rows: torch.Tensor | None = None  # [num_restricted_rows] rows with an allow-list
    allowed_local_rows: torch.Tensor | None = None  # [num_allowed] index into allowed_rows
    allowed_token_ids: torch.Tensor | None = None  # [num_allowed]
    banned_rows: torch.Tensor | None = None  # [num_banned] bad_words: (row, token) set to -inf
    banned_token_ids: torch.Tensor | None = None  # [num_banned]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> LogitEdits:
        return LogitEdits(
            **{
                name: None if value is None else value.to(device, non_blocking=non_blocking)
                for name, value in self.__dict__.items()
            }
        )


def build_logit_edits(
    params: Sequence[SamplingParams],
    vocab_size: int,
    output_token_ids: Sequence[Sequence[int]] | None = None,
) -> LogitEdits | None:
    """The batch's edits, or None when no request has logit_bias, allowed_token_ids or
    bad_words. output_token_ids: each row's generated tokens (bad_words needs them).

    Token ids outside [0, vocab_size) cannot be sampled and are dropped here; the server
    refuses them earlier with a 400 naming the field.
    """
    bias_rows: list[int] = []
    bias_ids: list[int] = []
    bias_values: list[float] = []
    allowed_rows: list[int] = []
    local_rows: list[int] = []
    allowed_ids: list[int] = []
    for row, p in enumerate(params):
        for token_id, value in (p.logit_bias or {}).items():
            if 0 <= int(token_id) < vocab_size:
                bias_rows.append(row)
                bias_ids.append(int(token_id))
                bias_values.append(float(value))
        if p.allowed_token_ids:
            local = len(allowed_rows)
            allowed_rows.append(row)
            for token_id in set(p.allowed_token_ids):
                if 0 <= token_id < vocab_size:
                    local_rows.append(local)
                    allowed_ids.append(token_id)
    banned_rows: list[int] = []
    banned_ids: list[int] = []
    for row, p in enumerate(params):
        if p.bad_words_token_ids:
            if output_token_ids is None:
                raise ValueError("bad_words needs each row's output token ids")
            for token_id in banned_by_bad_words(p.bad_words_token_ids, output_token_ids[row]):
                if 0 <= token_id < vocab_size:
                    banned_rows.append(row)
                    banned_ids.append(token_id)
    if not bias_rows and not allowed_rows and not banned_rows:
        return None
    edits = LogitEdits()
    if bias_rows:
        edits.bias_rows = torch.tensor(bias_rows, dtype=torch.int64)
        edits.bias_token_ids = torch.tensor(bias_ids, dtype=torch.int64)
        edits.bias_values = torch.tensor(bias_values, dtype=torch.float32)
    if allowed_rows:
        edits.allowed_rows = torch.tensor(allowed_rows, dtype=torch.int64)
        edits.allowed_local_rows = torch.tensor(local_rows, dtype=torch.int64)
        edits.allowed_token_ids = torch.tensor(allowed_ids, dtype=torch.int64)
    if banned_rows:
        edits.banned_rows = torch.tensor(banned_rows, dtype=torch.int64)
        edits.banned_token_ids = torch.tensor(banned_ids, dtype=torch.int64)
    return edits


def apply_logit_edits_(logits: torch.Tensor, edits: LogitEdits) -> None:
    """Restrict rows to their allowed ids (others -inf), then add the biases; in place."""
    if edits.allowed_rows is not None:
        blocked = torch.ones(
            (edits.allowed_rows.shape[0], logits.shape[-1]), dtype=torch.bool, device=logits.device
        )
        blocked[edits.allowed_local_rows, edits.allowed_token_ids] = False
        logits[edits.allowed_rows] = logits[edits.allowed_rows].masked_fill(blocked, float("-inf"))
    if edits.banned_rows is not None:
        logits[edits.banned_rows, edits.banned_token_ids] = float("-inf")
    if edits.bias_rows is not None:
        logits.index_put_(
            (edits.bias_rows, edits.bias_token_ids),
            edits.bias_values.to(logits.dtype),
            accumulate=True,
        )
