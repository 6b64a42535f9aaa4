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


def reference_token_ids(engine_off, model_path, options, prompts, params, **engine_options):
    """The tokens without speculation, from an engine split the same way: speculation must be
    exact against the same split; the split itself need not be bitwise equal to one process
    (tensor-parallel ranks sum each layer's halves in another order, and the tiny random
    models' looping outputs hold near-ties)."""
    if options.get("tensor_parallel_size", 1) == 1:
        return first_token_ids(engine_off.generate(prompts, params, use_tqdm=False))
    from ladle import LLM

    reference = LLM(model_path, **engine_options, **options)
    try:
        return first_token_ids(reference.generate(prompts, params, use_tqdm=False))
    finally:
        reference.engine.executor.shutdown()
