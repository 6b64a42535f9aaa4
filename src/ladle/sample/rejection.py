"""Speculative decoding's acceptance test (Leviathan et al. 2023, Chen et al. 2023), row by row.

A request that verifies k drafts samples k + 1 rows: row j (j drafts before it) decides on
draft j, and row k is the bonus row after the last draft. Every row here yields one token, the
"row token": the draft itself when the row accepts it, else a draw from the residual
distribution; a bonus row (draft id -1) draws from the target. The host then walks a request's
rows and keeps drafts while the row token equals the draft, ending with the first row token that
differs (or the bonus row's): no per-request op runs on the device and no host sync happens here.
A rejected row can never yield its own draft (the residual gives it zero mass), so "row token ==
draft" is exactly "accepted".

The rule, with p the target's distribution after all of ladle's logit processing (grammar, bans,
logit bias, allowed ids, bad words, penalties, temperature, min-p, top-k, top-p) and q the
draft's: accept draft t with probability min(1, p(t) / q(t)); on rejection draw from
max(p - q, 0), renormalised. The emitted tokens are then distributed exactly as the target's.

- draft_probs=None: a model-free proposer (n-gram, suffix), whose draft is a point mass at t.
  Acceptance then has probability p(t) and the residual is p with t removed. The row draws its
  Gumbel race (the same counter stream a one-token step at that output index draws) and accepts
  iff the race picks t: that event has probability p(t), and given it fails the winner is
  distributed as the residual, so this is the rule above with its coin tied to the race. The
  tie buys a property an independent coin cannot give: a seeded request emits the same tokens
  whether or not, and however deep, it was drafted, so its output does not depend on the batch
  even though adaptive speculation picks draft lengths from the batch size.
- draft_probs given (draft models, EAGLE heads): an independent acceptance uniform per row
  (rng.counter_row_uniforms of the row's seed and step) and the residual drawn with the row's
  Gumbel noise.

Greedy rows take the argmax of the processed logits and accept iff it equals the draft: the
target is then a point mass, whatever the draft's distribution.
"""

from __future__ import annotations

import random

import torch

from ladle.sample.rng import counter_gumbels, counter_row_uniforms

NO_DRAFT = -1


def rejection_sample(
    logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    gumbels: torch.Tensor | None = None,
) -> torch.Tensor:
    """Row tokens, int64 [num_rows], for random (non-greedy) rows; see the module docstring.

    logits: float32 [num_rows, vocab], processed (temperature applied, truncated ids at -inf).
    draft_token_ids: int64 [num_rows], the draft each row decides on, NO_DRAFT for bonus rows.
    seeds, steps: [num_rows] the rows' random streams (step: the row's output index).
    draft_probs: float32 [num_rows, vocab] the draft's distribution at each row, or None for
    point-mass drafts. gumbels: the rows' noise when the caller has it (tests), else drawn.
    """
    if gumbels is None:
        gumbels = counter_gumbels(seeds, steps, logits.shape[-1])
    if draft_probs is None:
        return (logits + gumbels).argmax(dim=-1)
    if draft_probs.shape != logits.shape:
        raise ValueError(
            f"draft_probs has shape {tuple(draft_probs.shape)}, the logits {tuple(logits.shape)}"
        )
    has_draft = draft_token_ids >= 0
    drafts = draft_token_ids.clamp(min=0)[:, None]
    probs = torch.softmax(logits, dim=-1)
    target_at_draft = probs.gather(1, drafts).squeeze(1)
    draft_at_draft = draft_probs.to(probs.dtype).gather(1, drafts).squeeze(1)
    # u < p/q without a division: q(t) may be 0 for a draft the proposer forced (then p/q is
    # infinite and the draft is accepted whenever p(t) > 0).
    uniforms = counter_row_uniforms(seeds, steps)
    accepted = has_draft & (uniforms * draft_at_draft < target_at_draft)
    residual = torch.where(has_draft[:, None], (probs - draft_probs).clamp_(min=0.0), probs)
    # p == q leaves nothing: rejection then has probability 0, any distribution will do.
    is_empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(is_empty, probs, residual)
    draws = (residual.log() + gumbels).argmax(dim=-1)
    return torch.where(accepted, draft_token_ids, draws)


def emitted_tokens(
    row_tokens: list[int], rows: list[tuple[int, int]], drafts: list[list[int]]
) -> list[list[int]]:
    """The host's walk: per request, the drafts its rows accepted, then the first row token that
    differs from its draft (or the bonus row's). rows: (request position, drafts before the
    row), a request's rows in order; drafts: each request's draft ids."""
    emitted: list[list[int]] = [[] for _ in drafts]
    stopped: set[int] = set()
    for token, (position, offset) in zip(row_tokens, rows):
        if position in stopped:
            continue
        emitted[position].append(token)
        if offset >= len(drafts[position]) or token != drafts[position][offset]:
            stopped.add(position)
    return emitted


def synthetic_emitted_tokens(
    row_tokens: list[int],
    rows: list[tuple[int, int]],
    drafts: list[list[int]],
    acceptance: float,
    coin: random.Random,
) -> list[list[int]]:
    """emitted_tokens for benchmarks on random weights: each draft is accepted with probability
    `acceptance` whatever the row says (coin: the runner's own seeded stream, so a run's coins
    do not depend on what else ran in the process), and the first refused draft's row token
    ends the request's tokens. The outputs are then not the model's; only the speed means
    anything."""
    emitted: list[list[int]] = [[] for _ in drafts]
    stopped: set[int] = set()
    for token, (position, offset) in zip(row_tokens, rows):
        if position in stopped:
            continue
        request_drafts = drafts[position]
        if offset < len(request_drafts) and coin.random() < acceptance:
            emitted[position].append(request_drafts[offset])
            continue
        emitted[position].append(token)
        stopped.add(position)
    return emitted

