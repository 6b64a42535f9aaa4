"""Drafted requests planned while their verify step is in flight (n-gram drafts made on the
device, core/drafts_in_flight.py, worker/drafts_on_device.py), on the CPU in fp32 with overlap
forced on: the tokens equal those without speculation; the steps really overlap; EOS, stop ids
and max_tokens inside accepted drafts end at the right token; aborts leak no KV block."""

from __future__ import annotations

import random

import pytest

from ladle import LLM, SamplingParams

ENGINE_OPTIONS = {"cpu_kv_cache_gib": 0.1, "block_size": 4, "max_num_seqs": 64}
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False}


def _repetitive_prompts(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        phrase = [rng.randrange(5, 500) for _ in range(rng.randint(2, 6))]
        prompt = [rng.randrange(5, 500) for _ in range(rng.randint(0, 5))]
        prompt += phrase * rng.randint(2, 4) + phrase[: rng.randint(0, len(phrase))]
        prompts.append({"prompt_token_ids": prompt})
    return prompts


def _tokens(outputs) -> list[list[int]]:
    return [list(output.outputs[0].token_ids) for output in outputs]


@pytest.fixture(scope="module")
def model_path(tiny_model_path):
    return tiny_model_path("llama")


@pytest.fixture(scope="module")
def engine_off(model_path):
    return LLM(model_path, **ENGINE_OPTIONS)


@pytest.fixture(scope="module")
def engine_in_flight(model_path):
    llm = LLM(model_path, async_scheduling=True, speculative_config=NGRAM, **ENGINE_OPTIONS)
    assert llm.engine.overlaps and llm.engine.scheduler.drafts_on_device
    return llm


def _assert_no_blocks_held(llm: LLM) -> None:
    stats = llm.engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks


def test_greedy_tokens_equal_those_without_speculation(engine_in_flight, engine_off):
    prompts = _repetitive_prompts(40)
    params = [
        SamplingParams(temperature=0, max_tokens=8 + 5 * (i % 7), ignore_eos=True)
        for i in range(len(prompts))
    ]
    expected = _tokens(engine_off.generate(prompts, params, use_tqdm=False))
    before = engine_in_flight.engine.get_stats().spec_decode
    got = _tokens(engine_in_flight.generate(prompts, params, use_tqdm=False))
    alone = _tokens(engine_in_flight.generate(prompts[:1], params[:1], use_tqdm=False))
    assert got == expected and alone == expected[:1]
    stats = engine_in_flight.engine.get_stats().spec_decode
    assert stats.num_accepted_tokens - before.num_accepted_tokens > 50
    assert stats.num_draft_tokens > stats.num_accepted_tokens  # some were rejected too
    _assert_no_blocks_held(engine_in_flight)


def test_drafted_requests_are_planned_while_their_verify_step_runs(engine_in_flight):
    """The plan made while a step is in flight drafts for requests that step verifies drafts
    for: their steps overlap (without device drafts they would wait for the read)."""
    engine = engine_in_flight.engine
    original = engine.scheduler.schedule
    overlapped: list[str] = []

    def watching_schedule():
        in_flight = engine._in_flight
        plan = original()
        if in_flight is not None:
            verifying = {s.request_id for s in in_flight.future.plan.scheduled if s.draft_token_ids}
            for scheduled in plan.scheduled:
                if scheduled.request_id in verifying and scheduled.draft_token_ids:
                    assert scheduled.num_unverified_before > 0
                    overlapped.append(scheduled.request_id)
        return plan

    engine.scheduler.schedule = watching_schedule
    try:
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        engine_in_flight.generate(_repetitive_prompts(4, seed=1), params, use_tqdm=False)
    finally:
        engine.scheduler.schedule = original
    assert len(overlapped) > 10
