"""Constrained requests through preemption (recompute) and prefix-cache hits: the grammar state
stays in step with the output, so the tokens equal those of a run where neither happens, and
every output follows its constraint. A tiny random Llama with its real (byte-level) tokenizer."""

from __future__ import annotations

import json
import random
import re

import pytest

from ladle import LLM, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "k": {"type": "integer", "minimum": 0, "maximum": 999},
        "ok": {"type": "boolean"},
    },
    "required": ["k", "ok"],
    "additionalProperties": False,
}
REGEX = "[a-z]{4,9}-[0-9]{2}"
CHOICES = ["alpha", "beta", "gamma delta"]


def _prompts() -> list[list[int]]:
    rng = random.Random(5)
    shared = [rng.randrange(3, 500) for _ in range(12)]  # a shared prefix: prefix-cache hits
    return [shared + [rng.randrange(3, 500) for _ in range(4 + 3 * i)] for i in range(6)]


def _params() -> list[SamplingParams]:
    constraints = [{"json": SCHEMA}, {"regex": REGEX}, {"choice": CHOICES}] * 2
    return [
        SamplingParams(temperature=0, max_tokens=48, structured_outputs=constraint)
        for constraint in constraints
    ]


@pytest.fixture(scope="module")
def reference(tiny_model_path):
    path = tiny_model_path("llama")
    llm = LLM(path, num_kv_blocks=400, enable_prefix_caching=False)
    outputs = llm.generate(_prompts(), _params(), use_tqdm=False)
    return path, [o.outputs[0] for o in outputs]


def _check_constraints(samples) -> None:
    for index, sample in enumerate(samples):
        assert sample.finish_reason == "stop", (index, sample.text)  # the grammar completed
        if index % 3 == 0:
            value = json.loads(sample.text)
            assert set(value) == {"k", "ok"} and 0 <= value["k"] <= 999
        elif index % 3 == 1:
            assert re.fullmatch(REGEX, sample.text), sample.text
        else:
            assert sample.text in CHOICES


def test_preemption_and_prefix_hits_keep_the_grammar_in_step(reference):
    path, expected = reference
    _check_constraints(expected)
    # Blocks of 4 tokens, too few for all six at once: requests are preempted and recomputed
    # (their prompt blocks hit the prefix cache), then sample on from where their grammar is.
    llm = LLM(path, block_size=4, num_kv_blocks=24)
    outputs = [o.outputs[0] for o in llm.generate(_prompts(), _params(), use_tqdm=False)]
    stats = llm.engine.get_stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    assert [o.token_ids for o in outputs] == [o.token_ids for o in expected]
    _check_constraints(outputs)
