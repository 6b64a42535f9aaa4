"""The device n-gram drafts follow the host's prompt lookup (spec_decode/ngram.py): the same
match (longest n, latest occurrence), padded with the last token where the host has fewer."""

from __future__ import annotations

import random

import torch

from ladle.spec_decode.ngram import NgramIndex
from ladle.worker.device_ngram import ngram_drafts


def _host_drafts(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    drafts = NgramIndex(min_n, max_n).lookup(tokens, k)
    return drafts + [tokens[-1]] * (k - len(drafts))


def test_device_drafts_equal_the_host_lookup_padded():
    rng = random.Random(0)
    sequences = []
    for _ in range(60):
        vocab = rng.choice([3, 5, 20])  # small vocabularies repeat, so n-grams match
        sequences.append([rng.randrange(vocab) for _ in range(rng.randint(1, 40))])
    width = max(len(s) for s in sequences) + 3
    lengths = torch.tensor([len(s) for s in sequences])
    for min_n, max_n, k in [(2, 5, 4), (1, 3, 6), (3, 3, 2)]:
        # max_n columns of -1, then the tokens, then junk past each one's end.
        history = torch.full((len(sequences), max_n + width), 7, dtype=torch.int32)
        history[:, :max_n] = -1
        for row, tokens in enumerate(sequences):
            history[row, max_n : max_n + len(tokens)] = torch.tensor(tokens)
        got = ngram_drafts(history, lengths, k, min_n, max_n).tolist()
        expected = [_host_drafts(tokens, k, min_n, max_n) for tokens in sequences]
        assert got == expected
