"""Overlapped scheduling (async_scheduling) gives exactly the tokens of synchronous steps.

The CPU runs the same overlap machinery as CUDA when it is asked for (pending tokens in the
scheduler, decode input ids read from the persistent batch's device copy, outputs read one step
late), so these tests check it against HF's greedy tokens and against synchronous steps, over
chunked prefill, preemption, stop tokens met mid-flight, seeded sampling, penalties (their token
ids on the device) and logprobs.
"""

from __future__ import annotations

import random

import pytest
from helpers.tiny_models import hf_greedy

from ladle import LLM, SamplingParams
from ladle.protocol.messages import EngineCoreRequest

NUM_NEW_TOKENS = 10


def make_prompts(vocab_size: int, seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab_size) for _ in range(length)] for length in lengths]


def token_ids(outputs) -> list[list[int]]:
    return [output.outputs[0].token_ids for output in outputs]


@pytest.fixture(scope="module")
def qwen3(tiny_model_path):
    from helpers.tiny_models import load_hf_reference

    path = tiny_model_path("qwen3")
    model = load_hf_reference(path)
    prompts = make_prompts(model.config.vocab_size, seed=3, lengths=[1, 4, 9, 17, 30, 45])
    expected = [hf_greedy(model, prompt, NUM_NEW_TOKENS) for prompt in prompts]
    return path, prompts, expected


def greedy(**extra) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True, **extra)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_num_batched_tokens": 8, "enable_prefix_caching": False},  # chunked prefill
        {"num_kv_blocks": 24},  # preemption while steps are in flight
    ],
    ids=["batched", "chunked", "preempting"],
)
def test_overlapped_steps_match_hf(qwen3, options):
    path, prompts, expected = qwen3
    options = {"block_size": 4, "num_kv_blocks": 400, **options}
    llm = LLM(path, async_scheduling=True, **options)
    assert llm.engine.overlaps
    assert token_ids(llm.generate(prompts, greedy(), use_tqdm=False)) == expected
    stats = llm.engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks  # nothing leaked by discarded tokens
    if options["num_kv_blocks"] == 24:
        assert stats.num_preemptions > 0


def test_outputs_arrive_one_step_late_with_overlap(qwen3):
    path, prompts, expected = qwen3
    llm = LLM(path, block_size=4, num_kv_blocks=400, async_scheduling=True)
    engine = llm.engine
    engine.add_request(
        EngineCoreRequest(request_id="r", prompt_token_ids=prompts[2], sampling_params=greedy())
    )
    assert engine.step() == []  # the prompt's step is launched, not read
    tokens = []
    while engine.has_unfinished_requests():
        tokens += [t for output in engine.step() for t in output.new_token_ids]
    assert tokens == expected[2]


def _mixed_params(stop_ids: list[int]) -> list[SamplingParams]:
    """Seeded random rows, rows that stop on a token met mid-generation, logprobs."""
    return [
        SamplingParams(temperature=0.8, seed=1, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=stop_ids[:1]),
        SamplingParams(temperature=1.0, top_k=5, seed=2, max_tokens=12, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=stop_ids[1:2]),
        SamplingParams(temperature=0.7, top_p=0.9, min_p=0.05, seed=3, max_tokens=7),
        SamplingParams(temperature=0.9, max_tokens=12, min_tokens=4, seed=5),
    ]


def _run(path, prompts, params, async_scheduling: bool):
    llm = LLM(path, block_size=4, num_kv_blocks=400, async_scheduling=async_scheduling)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [
        (
            o.outputs[0].token_ids,
            o.outputs[0].finish_reason,
            [sorted(entry.items()) for entry in o.outputs[0].logprobs or []],
        )
        for o in outputs
    ]


def test_overlap_on_and_off_give_the_same_outputs(qwen3):
    path, prompts, expected = qwen3
    # Stop ids the greedy rows meet a few tokens in: they end while their next step is in flight,
    # and that step's token must never be reported.
    stop_ids = [expected[1][3], expected[3][5]]
    params = _mixed_params(stop_ids)
    synchronous = _run(path, prompts, params, async_scheduling=False)
    overlapped = _run(path, prompts, params, async_scheduling=True)
    assert overlapped == synchronous
    assert synchronous[1][0] == expected[1][:4] and synchronous[1][1] == "stop"
    assert len(synchronous[4][0]) == 7 and synchronous[2][2]  # max_tokens, logprobs given


def test_penalty_requests_agree_with_overlap_off(qwen3):
    path, prompts, _ = qwen3
    params = _mixed_params([])
    params[0] = SamplingParams(
        temperature=0.0, max_tokens=12, repetition_penalty=1.3, frequency_penalty=0.4
    )
    synchronous = _run(path, prompts, params, async_scheduling=False)
    overlapped = _run(path, prompts, params, async_scheduling=True)
    assert overlapped == synchronous


def test_scheduler_hands_the_runner_only_new_blocks(qwen3):
    """The block-table diff: a request's whole table on its first step, then only the blocks
    a step added (none for most decode steps), and the runner's tables equal the manager's."""
    path, prompts, _ = qwen3
    llm = LLM(path, block_size=4, num_kv_blocks=400, async_scheduling=True)
    engine = llm.engine
    for index, prompt in enumerate(prompts):
        engine.add_request(
            EngineCoreRequest(
                request_id=str(index), prompt_token_ids=prompt, sampling_params=greedy()
            )
        )
    schedule = engine.scheduler.schedule
    seen: list[dict] = []

    def recording_schedule():
        output = schedule()
        seen.append(
            {
                s.request_id: (s.new_blocks.start, s.new_blocks.block_ids)
                for s in output.scheduled
                if s.new_blocks is not None
            }
        )
        return output

    engine.scheduler.schedule = recording_schedule
    engine.step()
    assert set(seen[0]) == {str(i) for i in range(len(prompts))}
    assert all(start == 0 for start, _ in seen[0].values())
    while engine.has_unfinished_requests():
        engine.step()
        batch = engine.executor.worker.runner.batch
        for request in engine.scheduler.running:
            slot = batch._slot_of.get(request.request_id)
            if slot is None:
                continue
            table = engine.kv_cache_manager.get_block_ids(request.request_id)
            assert batch.block_table_host[slot, : len(table)].tolist() == table
            assert batch.num_blocks[slot] == len(table)
            assert batch.block_table[slot, : len(table)].tolist() == table  # the device copy
    decode_diffs = seen[2:]
    # One token a step and four a block: about one step in four hands a request a new block.
    assert sum(len(diff) for diff in decode_diffs) < len(prompts) * len(decode_diffs) / 2
    assert all(len(ids) == 1 for diff in decode_diffs for _, ids in diff.values())


def test_bad_words_and_prompt_logprobs_requests_agree_with_overlap_off(qwen3):
    """bad_words bans a word's last token once the output ends with the rest of it, so it needs
    every token on the host (its steps launch split, split_launch.py); prompt logprobs are read
    at the step that computes the prompt, whose start the scheduler has already advanced past."""
    path, prompts, expected = qwen3
    word = expected[0][2:4]  # greedy writes this pair at positions 2-3: the ban must change it
    params = _mixed_params([])
    params[0] = SamplingParams(temperature=0.0, max_tokens=12, bad_words_token_ids=[word])
    params[2] = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=2)
    runs = {}
    for async_scheduling in (False, True):
        llm = LLM(path, block_size=4, num_kv_blocks=400, async_scheduling=async_scheduling)
        outputs = llm.generate(prompts, params, use_tqdm=False)
        runs[async_scheduling] = [
            (o.outputs[0].token_ids, [sorted(e.items()) for e in o.prompt_logprobs or [] if e])
            for o in outputs
        ]
    assert runs[True] == runs[False]
    banned_run = runs[False][0][0]
    assert banned_run[:3] == expected[0][:3] and banned_run[3] != expected[0][3]
    assert len(runs[False][2][1]) == len(prompts[2]) - 1  # every prompt token after the first
