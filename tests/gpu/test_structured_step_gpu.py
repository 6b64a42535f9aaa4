"""Structured output through EngineCore.step on CUDA: the grammar job on its worker thread, the
mask copied on a side stream and applied in one launch. Constrained rows follow their grammar;
the unconstrained rows of the same batch sample exactly what they sample in a batch with no
grammar at all.

Random weights of SmolLM2-135M's shape with its tokenizer: LADLE_TEST_TOKENIZER names a tokenizer
folder (the GPU machines have no copy of the default model), else the default model's is used.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
        "kind": {"enum": ["a", "b"]},
    },
    "required": ["name", "count", "kind"],
    "additionalProperties": False,
}
REGEX = "[A-Z]{2}-[0-9]{3}"
CHOICES = ["red", "green", "blue"]
MAX_TOKENS = 64


def _tokenizer_source() -> str:
    folder = os.environ.get("LADLE_TEST_TOKENIZER")
    if folder:
        return folder
    from ladle.model.default_model import resolve_default_model

    return str(resolve_default_model())


@pytest.fixture(scope="module")
def tokenizer():
    from ladle.model.tokenizer import load_tokenizer

    return load_tokenizer(_tokenizer_source())


@pytest.fixture(scope="module")
def engine():
    from ladle.config import EngineConfig
    from ladle.engine.engine_core import EngineCore

    # num_kv_blocks: sized from gpu_memory_utilization (0.9) this module-long engine took 67
    # GiB of the GPU that the suite's other workers share, and their tests ran out of memory
    # (session 11, round 48: test_fp8_kv_cache.py twice).
    config = EngineConfig.from_kwargs(
        model="smollm2-135m",
        load_format="dummy",
        tokenizer=_tokenizer_source(),
        num_kv_blocks=2048,
    )
    return EngineCore(config)


def _run(engine, constraints: dict[int, dict], batch: int, tag: str) -> dict[int, list[int]]:
    """Every row runs exactly MAX_TOKENS steps (ignore_eos), so both runs have the same batch
    shapes at every step and the unconstrained rows can be compared token for token."""
    from ladle.protocol.messages import EngineCoreRequest
    from ladle.sampling.params import SamplingParams

    for index in range(batch):
        params = SamplingParams(
            temperature=0,
            max_tokens=MAX_TOKENS,
            ignore_eos=True,
            structured_outputs=constraints.get(index),
        )
        engine.add_request(
            EngineCoreRequest(
                request_id=f"{tag}-{index}",
                prompt_token_ids=[(index * 53 + j) % 4000 + 20 for j in range(9 + index)],
                sampling_params=params,
            )
        )
    tokens: dict[int, list[int]] = {index: [] for index in range(batch)}
    finished = set()
    for _ in range(500):
        for output in engine.step():
            index = int(output.request_id.rsplit("-", 1)[1])
            tokens[index] += output.new_token_ids
            if output.finish_reason is not None:
                assert output.finish_reason == "length", output
                finished.add(index)
        if len(finished) == batch:
            return tokens
    raise AssertionError("the batch did not finish")


def test_grammar_rows_follow_their_grammar_and_the_others_are_untouched(engine, tokenizer):
    constraints = {1: {"json": SCHEMA}, 4: {"regex": REGEX}, 6: {"choice": CHOICES}}
    batch = 12
    plain = _run(engine, {}, batch, "plain")
    mixed = _run(engine, constraints, batch, "mixed")
    for index in range(batch):
        if index not in constraints:
            assert mixed[index] == plain[index], index  # unconstrained rows pay nothing

    def text(index: int) -> str:
        # After a complete value the grammar allows only the end token (ignored here).
        ids = [t for t in mixed[index] if t not in tokenizer.eos_token_ids]
        return tokenizer.decode(ids, skip_special_tokens=True)

    value = json.loads(text(1))
    assert set(value) == {"name", "count", "kind"} and value["kind"] in ("a", "b")
    assert 0 <= value["count"] <= 99 and len(value["name"]) <= 8
    assert re.fullmatch(REGEX, text(4)), text(4)
    assert text(6) in CHOICES
