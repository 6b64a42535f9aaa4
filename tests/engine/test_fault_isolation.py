"""Fault isolation in the engine core: a request that makes a step fail ends alone with
finish_reason "error" and a message; every other request produces exactly the tokens it would
have produced without it. A failure no request can be blamed for still ends the engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ladle import LLM, SamplingParams
from ladle.distributed.pipeline import PipelineStage
from ladle.entrypoints.llm import RequestErrors
from ladle.executor.multiprocess import _WorkerLoop
from ladle.protocol.step import ScheduledRequest, StepPlan

POISON = 13  # a prompt starting with this token breaks any step it is in
PROMPTS = [[5, 6, 7, 8], [POISON, 9, 10], [21, 22, 23, 24, 25], [POISON, 1], [30, 31]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model_path):
    return LLM(tiny_model_path("llama"), block_size=4, max_model_len=64, num_kv_blocks=200)


def break_steps_with(llm, should_fail, error_type=ValueError):
    """Wrap the worker so that a step whose batch satisfies should_fail raises. should_fail
    sees the step's requests as the scheduler holds them (prompt_token_ids, ...)."""
    execute = llm.engine.executor.worker.execute
    scheduler = llm.engine.scheduler

    def faulty(plan, grammar_bitmask=None):
        requests = [scheduler.requests[s.request_id] for s in plan.scheduled]
        if should_fail(requests):
            raise error_type("simulated failure while building the step")
        return execute(plan, grammar_bitmask)

    return execute, faulty


def assert_pool_drained(llm):
    stats = llm.engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert not llm.engine.has_unfinished_requests()


def test_a_request_that_breaks_the_step_ends_alone(llm, monkeypatch):
    clean = llm.generate([p for p in PROMPTS if p[0] != POISON], PARAMS, use_tqdm=False)
    original, faulty = break_steps_with(
        llm, lambda requests: any(r.prompt_token_ids[0] == POISON for r in requests)
    )
    monkeypatch.setattr(llm.engine.executor.worker, "execute", faulty)
    with pytest.raises(RequestErrors) as caught:
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    outputs = caught.value.outputs
    for output, prompt in zip(outputs, PROMPTS, strict=True):
        if prompt[0] == POISON:
            assert output.outputs[0].finish_reason == "error"
            assert "simulated failure" in output.error and "ValueError" in output.error
        else:
            assert output.error is None
    good = [o for o, p in zip(outputs, PROMPTS, strict=True) if p[0] != POISON]
    assert [o.outputs[0].token_ids for o in good] == [o.outputs[0].token_ids for o in clean]
    assert_pool_drained(llm)
    # The engine keeps serving afterwards.
    monkeypatch.setattr(llm.engine.executor.worker, "execute", original)
    again = llm.generate(PROMPTS[:1], PARAMS, use_tqdm=False)
    assert again[0].outputs[0].token_ids == clean[0].outputs[0].token_ids


def test_a_failure_mid_generation_keeps_the_tokens_of_the_others(llm, monkeypatch):
    """The poisoned request breaks only once it has generated 2 tokens (a decode step)."""
    clean = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    _, faulty = break_steps_with(
        llm, lambda requests: any(
            r.prompt_token_ids[0] == POISON and r.num_output_tokens >= 2 for r in requests
        ),
    )
    monkeypatch.setattr(llm.engine.executor.worker, "execute", faulty)
    outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False, raise_on_error=False)
    for output, reference, prompt in zip(outputs, clean, PROMPTS, strict=True):
        if prompt[0] == POISON:
            assert output.outputs[0].finish_reason == "error"
            assert output.outputs[0].token_ids == reference.outputs[0].token_ids[:2]
        else:
            assert output.outputs[0].token_ids == reference.outputs[0].token_ids
    assert_pool_drained(llm)


@pytest.mark.parametrize(
    ("should_fail", "error_type"),
    [
        (lambda requests: True, torch.OutOfMemoryError),  # the device, not a request
        (lambda requests: len(requests) > 1, ValueError),  # no request fails alone
    ],
    ids=["out-of-memory", "only-in-combination"],
)
def test_a_failure_that_cannot_be_attributed_ends_the_engine(
    tiny_model_path, monkeypatch, should_fail, error_type
):
    llm = LLM(tiny_model_path("llama"), block_size=4, max_model_len=64, num_kv_blocks=200)
    _, faulty = break_steps_with(llm, should_fail, error_type)
    monkeypatch.setattr(llm.engine.executor.worker, "execute", faulty)
    with pytest.raises(error_type):
        llm.generate(PROMPTS, PARAMS, use_tqdm=False)


@pytest.mark.parametrize("stages", [1, 2])
def test_a_pipeline_stage_does_not_probe_alone(stages):
    """Under pipeline parallelism a failing step is not probed request by request on the rank
    that failed (its probes would wait for hand-offs the other stages never send): the error
    leaves the worker loop, which ends the engine with it. One stage still probes."""
    calls = []

    def execute(plan, masks=None):
        calls.append([s.request_id for s in plan.scheduled])
        if any(s.request_id == "poison" for s in plan.scheduled):
            raise ValueError("simulated failure on this stage")
        return SimpleNamespace(is_ready=lambda: True)

    stage = PipelineStage(index=stages - 1, size=stages)
    worker = SimpleNamespace(
        execute=execute, stage=stage, sends_results=True, device=torch.device("cpu")
    )
    loop = _WorkerLoop(worker, inputs=None, outputs=None, parent_pid=None)
    plan = StepPlan(
        scheduled=[ScheduledRequest("ok", 1, 3, 0), ScheduledRequest("poison", 1, 3, 0)]
    )
    if stages == 1:
        loop._run_isolating(plan, None)
        assert loop.in_flight[0][2].keys() == {"poison"}  # found by probing, then left out
        assert calls[-1] == ["ok"]
    else:
        with pytest.raises(ValueError, match="simulated failure on this stage"):
            loop._run_isolating(plan, None)
        assert calls == [["ok", "poison"]]  # the step once, no probes
