"""Prompt lookup against a plain scan of the whole sequence, on random repetitive sequences, and
with tokens arriving a few at a time (the incremental index must equal a fresh one)."""

from __future__ import annotations

import random

import pytest

from ladle.spec_decode.ngram import NgramIndex, NgramProposer


def _scan(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The longest suffix of n in [min_n, max_n] tokens seen before, its latest occurrence,
    the k tokens after it: by brute force."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        for end in range(length - 1, n - 1, -1):
            if tokens[end - n : end] == suffix:
                return tokens[end : end + k]
    return []


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(("min_n", "max_n"), [(1, 1), (2, 5), (3, 8)])
def test_lookup_equals_a_full_scan(seed, min_n, max_n):
    rng = random.Random(seed)
    alphabet = rng.choice([3, 5, 20])
    tokens: list[int] = []
    index = NgramIndex(min_n, max_n)
    for _ in range(120):
        tokens += [rng.randrange(alphabet) for _ in range(rng.randint(1, 4))]
        k = rng.randint(1, 8)
        assert index.lookup(tokens, k) == _scan(tokens, min_n, max_n, k)


def test_an_edit_copies_the_text_it_was_given():
    text = list(range(100, 160))
    prompt = [1, 2, 3] + text + [4, 5]
    proposer = NgramProposer(2, 5)
    # The answer has started to copy the text: the draft is the text's next tokens.
    assert proposer.propose_from("a", prompt + text[:10], 4) == text[10:14]
    # No earlier occurrence of the last tokens: no draft.
    assert proposer.propose_from("b", [7, 8, 9, 10], 4) == []
    proposer.release("a", [])
    assert "a" not in proposer.indexes
