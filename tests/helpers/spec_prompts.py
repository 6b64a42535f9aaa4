"""Prompts and readers shared by the speculative-decoding tests."""

from __future__ import annotations

import random


def repetitive_prompts(count: int, seed: int = 0) -> list[dict]:
    """Token-id prompts that repeat a random phrase: n-gram drafts find matches in them, so the
    speculation tests verify real drafts, accepted and rejected."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        phrase = [rng.randrange(5, 500) for _ in range(rng.randint(2, 6))]
        prompt = [rng.randrange(5, 500) for _ in range(rng.randint(0, 5))]
        prompt += phrase * rng.randint(2, 4) + phrase[: rng.randint(0, len(phrase))]
        prompts.append({"prompt_token_ids": prompt})
    return prompts


def first_token_ids(outputs) -> list[list[int]]:
    """Each request's first completion's token ids."""
    return [list(output.outputs[0].token_ids) for output in outputs]
