"""On CUDA, with decode graphs: grammar, bad_words and penalty rows beside plain rows give the
same tokens with overlap on (grammar / bad_words steps launched split, penalty ids on the device)
as with overlap off, and the grammar rows still follow their grammar.

Random weights of SmolLM2-135M's shape with its tokenizer (LADLE_TEST_TOKENIZER names the
folder on machines without the default model).
"""

from __future__ import annotations

import gc
import json
import os
import random
import re

import pytest
import torch

from ladle import LLM, SamplingParams
from ladle.executor import in_process
from ladle.worker import cuda_graphs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "count"],
    "additionalProperties": False,
}
REGEX = "[A-Z]{2}-[0-9]{3}"


def _tokenizer_source() -> str:
    folder = os.environ.get("LADLE_TEST_TOKENIZER")
    if folder:
        return folder
    from ladle.model.default_model import resolve_default_model

    return str(resolve_default_model())


def _params(rng: random.Random, index: int, banned_word: list[int]) -> SamplingParams:
    kind = index % 6
    common = dict(max_tokens=rng.randint(8, 40), ignore_eos=True)
    if kind == 0:  # room to finish the value (the structured-step test's length)
        return SamplingParams(
            temperature=0, structured_outputs={"json": SCHEMA}, max_tokens=64, ignore_eos=True
        )
    if kind == 1:
        return SamplingParams(
            temperature=0.8,
            seed=index,
            structured_outputs={"regex": REGEX},
            max_tokens=16,
            ignore_eos=True,
        )
    if kind == 2:
        return SamplingParams(temperature=0, bad_words_token_ids=[banned_word], **common)
    if kind == 3:
        return SamplingParams(
            temperature=0.9,
            seed=index,
            repetition_penalty=1.3,
            frequency_penalty=0.4,
            presence_penalty=0.2,
            **common,
        )
    if kind == 4:
        return SamplingParams(temperature=0, repetition_penalty=1.2, **common)
    return SamplingParams(temperature=0.7, seed=index, **common)


def test_mixed_rows_identical_with_overlap_on_and_off(monkeypatch):
    rng = random.Random(0)
    prompts = [[rng.randrange(20, 4000) for _ in range(rng.randint(4, 120))] for _ in range(48)]
    params = [_params(rng, index, [rng.randrange(20, 4000)] * 2) for index in range(48)]
    calls = []
    original = in_process.launch_step

    def counting(worker, plan, start_grammar_fill, between):
        if between is not None:  # the step before is read between forward and sampling
            calls.append(1)
        return original(worker, plan, start_grammar_fill, between)

    monkeypatch.setattr(in_process, "launch_step", counting)
    # With overlap on, a row that ended in step N (known only once N's ids are read) still rides
    # step N+1: that step has one more row than without overlap, so cuBLAS may pick another
    # kernel (another summation order) for its GEMMs (the logits GEMM is not padded), and on
    # these random weights' near-flat logits a bf16 rounding difference flips a near-tie token.
    # The property tested here is the split launch's, so the model runs in float32 (differences
    # of ~1e-7, not ~1e-3) and every decode step pads to the same graph bucket.
    monkeypatch.setattr(cuda_graphs, "graph_batch_sizes", lambda max_batch_size: [max_batch_size])
    results = {}
    for async_scheduling in (False, True):
        llm = LLM(
            model="smollm2-135m",
            load_format="dummy",
            tokenizer=_tokenizer_source(),
            dtype="float32",
            max_num_seqs=64,
            num_kv_blocks=2048,  # leave the device to the other engines of the test run
            async_scheduling=async_scheduling,
        )
        assert llm.engine.executor.worker.graphs is not None
        outputs = llm.generate(prompts, params, use_tqdm=False)
        results[async_scheduling] = [(o.outputs[0].token_ids, o.outputs[0].text) for o in outputs]
        if async_scheduling:
            assert calls  # grammar rows' steps were launched split
        else:
            assert not calls
        del llm, outputs
        gc.collect()
        torch.cuda.empty_cache()
    assert results[True] == results[False]
    for index, (_, text) in enumerate(results[False]):
        if index % 6 == 0:
            # ignore_eos: after the value the grammar allows only the end token, maybe repeated.
            value = json.loads(text.strip())
            assert set(value) == {"name", "count"} and 0 <= value["count"] <= 99
        if index % 6 == 1:
            assert re.fullmatch(REGEX, text.strip()), text
