"""Pipeline parallelism with one micro-batch per stage in flight (gloo, two stages on the CPU).

The engine keeps two steps of other requests in flight: the greedy tokens are HF's (fp32) for
requests of different lengths that arrive at different steps, with chunked prefill and with
preemption; no request ever samples in two steps in flight; an abort while the other
micro-batch runs leaks no block; a stage that dies ends the engine with a clear error and no
process left. The hand-offs themselves never wait on the host: stage 0
launches two steps before the last stage has even received the first (a deterministic check:
the last stage starts only once stage 0 says both are launched).
"""

from __future__ import annotations

import os
import random
import signal

import pytest
import torch.multiprocessing as mp
from helpers.pipeline_handoffs import run_stage
from helpers.tiny_models import hf_greedy, load_hf_reference

from ladle import LLM, SamplingParams
from ladle.protocol.messages import EngineCoreRequest

NUM_NEW_TOKENS = 8
LENGTHS = [3, 9, 17, 30, 6, 45]


@pytest.fixture(scope="module")
def reference(tiny_model_path):
    path = tiny_model_path("qwen3")
    model = load_hf_reference(path)
    rng = random.Random(7)
    prompts = [[rng.randrange(3, model.config.vocab_size) for _ in range(n)] for n in LENGTHS]
    return path, prompts, [hf_greedy(model, prompt, NUM_NEW_TOKENS) for prompt in prompts]


def _greedy(max_tokens: int = NUM_NEW_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _run(engine, prompts, abort_at: int | None = None):
    """Requests arrive one every two steps; returns (tokens by id, and for each submitted step
    the requests sampling in every step then in flight, itself last). abort_at: abort request
    'r1' while a step of it is in flight (the other micro-batch runs then), after that many
    steps."""
    tokens: dict[str, list[int]] = {}
    seen = []
    submit = engine.executor.submit

    def sampling(plan) -> set[str]:
        return {s.request_id for s in plan.scheduled if s.samples}

    def watched_submit(plan, *args, **kwargs):
        seen.append([sampling(p) for p in engine.in_flight_plans] + [sampling(plan)])
        return submit(plan, *args, **kwargs)

    engine.executor.submit = watched_submit
    step = 0
    aborted = False
    while step < 2 * len(prompts) or engine.has_unfinished_requests():
        if step % 2 == 0 and step // 2 < len(prompts):
            index = step // 2
            engine.add_request(
                EngineCoreRequest(
                    request_id=f"r{index}", prompt_token_ids=prompts[index],
                    sampling_params=_greedy(),
                )
            )  # fmt: skip
        for output in engine.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
        plans = engine.in_flight_plans
        ids_in_flight = {s.request_id for plan in plans for s in plan.scheduled}
        if abort_at is not None and not aborted and step >= abort_at and "r1" in ids_in_flight:
            engine.abort_requests(["r1"])
            aborted = True
        step += 1
        assert step < 500, "the engine did not finish"
    assert abort_at is None or aborted
    return tokens, seen


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_num_batched_tokens": 8, "enable_prefix_caching": False},  # chunked prefill
        {"num_kv_blocks": 20},  # preemption with two steps in flight
    ],
    ids=["arriving", "chunked", "preempting"],
)
def test_two_micro_batches_give_hf_tokens(reference, options):
    path, prompts, expected = reference
    llm = LLM(path, pipeline_parallel_size=2, block_size=4, **{"num_kv_blocks": 200, **options})
    engine = llm.engine
    try:
        assert engine.max_in_flight == 2
        tokens, seen = _run(engine, prompts)
        assert [tokens[f"r{i}"] for i in range(len(prompts))] == expected
        # Two steps really were in flight, and never with one request sampling in both.
        assert any(len(plans) == 2 and all(plans) for plans in seen)
        for plans in seen:
            assert len(plans) <= 2
            if len(plans) == 2:
                assert plans[0].isdisjoint(plans[1])
        stats = engine.get_stats()
        assert stats.num_free_blocks == stats.num_total_blocks
        if options.get("num_kv_blocks") == 20:
            assert stats.num_preemptions > 0
    finally:
        engine.executor.shutdown()


def test_abort_while_the_other_micro_batch_runs_leaks_nothing(reference):
    path, prompts, expected = reference
    llm = LLM(path, pipeline_parallel_size=2, block_size=4, num_kv_blocks=200)
    engine = llm.engine
    try:
        tokens, _ = _run(engine, prompts, abort_at=4)
        assert len(tokens.get("r1", [])) < NUM_NEW_TOKENS
        assert [tokens[f"r{i}"] for i in range(len(prompts)) if i != 1] == [
            e for i, e in enumerate(expected) if i != 1
        ]
        stats = engine.get_stats()
        assert stats.num_free_blocks == stats.num_total_blocks
        assert stats.num_running_reqs == stats.num_waiting_reqs == 0
    finally:
        engine.executor.shutdown()


@pytest.mark.parametrize(
    "rank", [0, pytest.param(1, marks=pytest.mark.slow)], ids=["first-stage", "last-stage"]
)
def test_a_dead_stage_ends_the_engine_and_leaves_no_process(reference, rank):
    path, prompts, _ = reference
    llm = LLM(path, pipeline_parallel_size=2, block_size=4, num_kv_blocks=200)
    engine = llm.engine
    processes = engine.executor._processes
    for index, prompt in enumerate(prompts[:4]):
        engine.add_request(EngineCoreRequest(f"r{index}", prompt, _greedy(max_tokens=150)))
    for _ in range(3):
        engine.step()
    assert engine.in_flight_plans  # a micro-batch is in flight when the rank dies
    os.kill(processes[rank].pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match=f"rank {rank} died|failed"):
        for _ in range(400):
            engine.step()
    for process in processes:
        assert process.wait(timeout=30) is not None


# ----- the hand-offs, two processes -----------------------------------------------------------


def test_stage_zero_launches_the_next_step_before_the_last_stage_starts(tmp_path):
    errors = mp.get_context("spawn").SimpleQueue()
    rendezvous = f"file://{tmp_path}/rendezvous"
    flag = str(tmp_path / "both-launched")
    mp.start_processes(run_stage, args=(rendezvous, flag, errors), nprocs=2, start_method="spawn")
    assert errors.empty(), errors.get()
