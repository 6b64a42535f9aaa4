"""write_last_tokens against the host's walk (sample/rejection.py emitted_tokens) on random
steps: every request's slot holds the last token verification emitted, whatever the row order
index_copy_ would have left."""

from __future__ import annotations

import random

import torch

from ladle.sample.rejection import emitted_tokens
from ladle.worker.last_emitted import write_last_tokens


def _random_step(rng: random.Random):
    rows, drafts, tokens, slots = [], [], [], []
    num_requests = rng.randint(1, 6)
    free_slots = rng.sample(range(16), num_requests)
    for position in range(num_requests):
        request_drafts = [rng.randrange(8) for _ in range(rng.choice([0, 0, 1, 3, 4]))]
        drafts.append(request_drafts)
        if rng.random() < 0.2 and position:  # a prompt chunk: no rows
            continue
        for offset in range(len(request_drafts) + 1):
            rows.append((position, offset))
            # Often the draft itself (accepted), else another token.
            agree = offset < len(request_drafts) and rng.random() < 0.6
            tokens.append(request_drafts[offset] if agree else rng.randrange(8))
            slots.append(free_slots[position])
    return rows, drafts, tokens, slots, free_slots


def test_matches_the_host_walk_on_random_steps():
    rng = random.Random(0)
    for _ in range(300):
        rows, drafts, tokens, slots, request_slots = _random_step(rng)
        if not rows:
            continue
        last_sampled = torch.full((16,), -5, dtype=torch.int64)
        write_last_tokens(last_sampled, torch.tensor(tokens), torch.tensor(slots), rows, drafts)
        emitted = emitted_tokens(tokens, rows, drafts)
        sampling = {position for position, _ in rows}
        for position, slot in enumerate(request_slots):
            expected = emitted[position][-1] if position in sampling else -5
            assert last_sampled[slot].item() == expected


def test_a_step_without_drafts_copies_its_rows():
    last_sampled = torch.zeros(4, dtype=torch.int64)
    write_last_tokens(last_sampled, torch.tensor([7, 9]), torch.tensor([3, 1]),
                      [(0, 0), (1, 0)], [[], []])
    assert last_sampled.tolist() == [0, 9, 0, 7]
