"""The KV cache's host tier through the whole engine on the CPU (a second pool stands in for
pinned host memory): multi-turn conversations through a device pool too small to keep them, so
their prefixes are evicted, written back and loaded again. Greedy tokens must equal those with
the tier off, and swap preemption those of recompute; afterwards no block is in use in either
tier."""

from __future__ import annotations

import random

import pytest

from ladle import LLM, SamplingParams
from ladle.engine.engine_core import EngineCore
from ladle.protocol.step import KV_LOAD, KV_STORE

BLOCK_SIZE = 4
# tiny-llama: 2 layers x K,V x 2 heads x 16 dims x 4 bytes x 4 tokens = 2 KiB a block; this is
# room for 100 host blocks (the device pool gets 24 usable).
HOST_GIB = 100 * 2048 / 1024**3
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def make_llm(**options) -> LLM:
    base = dict(
        load_format="dummy",
        dtype="float32",
        block_size=BLOCK_SIZE,
        num_kv_blocks=25,
        max_num_seqs=4,
        max_model_len=128,
        seed=0,
    )
    return LLM("tiny-llama", **{**base, **options})


def conversation_rounds(num_conversations: int = 4, num_turns: int = 3) -> list[list[list[int]]]:
    """Per round, every conversation's next prompt: its whole history plus a new turn (the
    replies are filled in as they come back, see run_conversations)."""
    rng = random.Random(7)
    return [
        [[rng.randrange(3, 500) for _ in range(rng.randrange(9, 15))] for _ in range(num_turns)]
        for _ in range(num_conversations)
    ]


def run_conversations(llm: LLM, turns: list[list[list[int]]]) -> list[list[int]]:
    histories = [[] for _ in turns]
    replies = []
    for turn in range(len(turns[0])):
        prompts = [
            {"prompt_token_ids": history + conversation[turn]}
            for history, conversation in zip(histories, turns)
        ]
        outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
        for index, output in enumerate(outputs):
            reply = list(output.outputs[0].token_ids)
            replies.append(reply)
            histories[index] = prompts[index]["prompt_token_ids"] + reply
    return replies


def record_kv_operations(engine: EngineCore) -> list:
    """Wrap the engine's executor so every plan's KV operations are kept (in order)."""
    operations = []
    submit = engine.executor.submit

    def recording_submit(plan, *args, **kwargs):
        operations.extend(plan.kv_operations)
        return submit(plan, *args, **kwargs)

    engine.executor.submit = recording_submit
    return operations


def assert_drained(engine: EngineCore) -> None:
    stats = engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.host_kv_usage == 0.0
    assert not engine.scheduler.has_kv_transfers


@pytest.fixture(scope="module")
def reference_replies():
    llm = make_llm(kv_offloading_size=0)
    assert llm.engine.kv_cache_manager.host_tier is None
    return run_conversations(llm, conversation_rounds())


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_tokens_with_the_host_tier_equal_those_without(reference_replies, async_scheduling):
    llm = make_llm(kv_offloading_size=HOST_GIB, async_scheduling=async_scheduling)
    engine = llm.engine
    assert engine.kv_cache_manager.host_tier.num_blocks == 100
    operations = record_kv_operations(engine)
    assert run_conversations(llm, conversation_rounds()) == reference_replies
    kinds = {op.kind for op in operations}
    assert kinds == {KV_STORE, KV_LOAD}  # prefixes were evicted and loaded back
    stats = engine.get_stats()
    assert stats.host_cache_hits > 0
    loaded = sum(len(op.source_block_ids) for op in operations if op.kind == KV_LOAD)
    assert stats.kv_bytes_to_device == loaded * 2048
    assert_drained(engine)


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_swap_preemption_gives_the_tokens_of_recompute(mode):
    # 12 usable blocks for 4 requests of up to 9 blocks each: preemption on every round.
    options = dict(num_kv_blocks=13, kv_offloading_size=HOST_GIB)
    prompts = [
        {"prompt_token_ids": [(17 * i + 5 * j) % 500 + 3 for j in range(20 + 3 * i)]}
        for i in range(4)
    ]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    reference = make_llm(kv_offloading_size=0, num_kv_blocks=64)
    expected = [list(o.outputs[0].token_ids) for o in reference.generate(prompts, params)]
    llm = make_llm(preemption_mode=mode, **options)
    got = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == expected
    stats = llm.engine.get_stats()
    assert stats.num_preemptions > 0
    swapped = stats.num_swapped_preemptions
    assert swapped == (stats.num_preemptions if mode == "swap" else 0)
    assert_drained(llm.engine)


def test_swap_needs_a_host_tier():
    with pytest.raises(ValueError, match="kv_offloading_size"):
        make_llm(preemption_mode="swap", kv_offloading_size=0)


def test_the_budget_line_shows_both_tiers():
    budget = make_llm(kv_offloading_size=HOST_GIB).engine.info.memory_budget
    line = budget.describe()
    assert "24 blocks of 4 tokens" in line and "96 tokens fit" in line
    assert "host tier" in line and "100 blocks, 400 tokens" in line
    off = make_llm().engine.info.memory_budget  # the CPU's default: no host tier
    assert off.num_host_blocks == 0 and "host tier off" in off.describe()


def test_host_tier_size_defaults():
    import torch

    from ladle.config import CacheConfig
    from ladle.worker.memory import (
        DEFAULT_HOST_TIER_CAP_GIB,
        GIB,
        available_host_bytes,
        host_tier_bytes,
    )

    assert host_tier_bytes(CacheConfig(), torch.device("cpu")) == 0  # the CPU: off
    assert host_tier_bytes(CacheConfig(kv_offloading_size=0.5), torch.device("cpu")) == GIB // 2
    on_cuda = host_tier_bytes(CacheConfig(), torch.device("cuda"))  # sizing only, no device
    assert 0 < on_cuda <= DEFAULT_HOST_TIER_CAP_GIB * GIB
    assert on_cuda <= available_host_bytes()
    assert host_tier_bytes(CacheConfig(kv_offloading_size=0), torch.device("cuda")) == 0
    with pytest.raises(ValueError, match="kv_offloading_size"):
        CacheConfig(kv_offloading_size=-1)


def test_copies_cross_to_a_worker_process(reference_replies):
    """The plan's KV operations and the result's reports survive the multi-process executor's
    wire (one worker process, msgspec over ZMQ)."""
    llm = make_llm(kv_offloading_size=HOST_GIB, distributed_executor_backend="mp")
    try:
        assert run_conversations(llm, conversation_rounds()) == reference_replies
        stats = llm.engine.get_stats()
        assert stats.host_cache_hits > 0 and stats.kv_bytes_to_device > 0
        assert_drained(llm.engine)
    finally:
        llm.engine.executor.shutdown()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_loaded_prefixes_equal_device_hits_bit_for_bit(async_scheduling):
    """One request at a time in bfloat16, so each request's steps have the same shapes in both
    runs: without the tier a large pool keeps every history as device hits; with it a small pool
    evicts them and they come back from the host. The tokens match only if every loaded byte
    does and every prefix is used (the GPU test's recipe, tests/gpu/test_kv_host_tier_gpu.py)."""
    options = dict(dtype="bfloat16", max_num_seqs=1, async_scheduling=async_scheduling)
    off = make_llm(kv_offloading_size=0, num_kv_blocks=512, **options)
    expected = run_conversations(off, conversation_rounds())
    on = make_llm(kv_offloading_size=HOST_GIB, **options)
    engine = on.engine
    operations = record_kv_operations(engine)
    assert run_conversations(on, conversation_rounds()) == expected
    assert any(op.kind == KV_LOAD for op in operations)
    assert_drained(engine)


def test_a_failed_load_recomputes_and_frees_both_tiers(reference_replies):
    llm = make_llm(kv_offloading_size=HOST_GIB)
    copier = llm.engine.executor.worker.runner.kv_copier
    real_load = copier._load
    failures = []

    def failing_load(*args):
        if not failures:  # the first load breaks mid-way, after its first copy
            failures.append(args)
            real_load(*args)
            raise RuntimeError("host memory unreadable")
        return real_load(*args)

    copier._load = failing_load
    assert run_conversations(llm, conversation_rounds()) == reference_replies
    assert failures
    assert llm.engine.kv_cache_manager.transfers.counts.num_failed_ops == 1
    assert_drained(llm.engine)


def test_abort_while_waiting_for_kv_frees_both_tiers(monkeypatch):
    from ladle.core.request import RequestStatus
    from ladle.executor.in_process import LocalStepFuture
    from ladle.protocol.messages import EngineCoreRequest

    # Overlapped, and the loads' outcome known only from the step's result (a worker in
    # another process): the result is read during the next step, so the abort lands while the
    # copy is in flight.
    monkeypatch.setattr(LocalStepFuture, "kv_operations_at_launch", lambda self: None)
    llm = make_llm(kv_offloading_size=HOST_GIB, async_scheduling=True)
    engine = llm.engine
    run_conversations(llm, conversation_rounds())  # histories now on the host only, in part
    first_history = [conversation[0] for conversation in conversation_rounds()]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for index, prompt in enumerate(first_history):
        engine.add_request(EngineCoreRequest(f"again-{index}", prompt + [7], params))
    waiting = []
    for _ in range(20):
        engine.step()
        waiting = [
            r.request_id for r in engine.scheduler.requests.values()
            if r.status == RequestStatus.WAITING_FOR_KV
        ]
        if waiting:
            break
    assert waiting, "no request waited for its KV"
    engine.abort_requests(waiting)
    while engine.has_unfinished_requests():
        engine.step()
    assert_drained(engine)


def steps_to_first_token(llm: LLM) -> int:
    """Engine steps from a returning turn's arrival to its first token, a neighbour decoding;
    the turn's prefix was evicted from the device (to the host tier, when there is one)."""
    import time

    engine = llm.engine
    first = [(7 * i) % 400 + 3 for i in range(60)]
    history = first + list(llm.generate([{"prompt_token_ids": first}], GREEDY,
                                        use_tqdm=False)[0].outputs[0].token_ids)
    filler = [(11 * i) % 400 + 5 for i in range(90)]  # 23 of the 24 blocks: evicts `first`
    llm.generate([{"prompt_token_ids": filler}], GREEDY, use_tqdm=False)
    decoding = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    llm._submit("neighbour", None, [5, 6, 7, 8], decoding, time.monotonic(), 0)
    for _ in range(3):
        llm.output_processor.process_outputs(engine.step())
    llm._submit("again", None, history + [9] * 5, GREEDY, time.monotonic(), 0)
    steps = 0
    for count in range(1, 20):
        outputs = engine.step()
        llm.output_processor.process_outputs(outputs)
        if any(o.request_id == "again" and o.new_token_ids for o in outputs):
            steps = count
            break
    while engine.has_unfinished_requests():
        llm.output_processor.process_outputs(engine.step())
    return steps


def test_a_loaded_turn_runs_in_the_plan_after_its_load():
    # Overlapped scheduling reads a step's result after planning the next one; the load's
    # outcome is known at launch, so the turn runs one plan after the load, not two: its first
    # token comes a step after the tier-off run's (which computes the prefix in one step).
    off = steps_to_first_token(make_llm(kv_offloading_size=0, async_scheduling=True))
    on_llm = make_llm(kv_offloading_size=HOST_GIB, async_scheduling=True)
    on = steps_to_first_token(on_llm)
    assert on_llm.engine.kv_cache_manager.host_cache_hits > 0
    assert (off, on) == (2, 3)
    assert_drained(on_llm.engine)


@pytest.mark.slow
def test_two_ranks_copy_their_own_heads():
    """Tensor parallel over gloo: each rank keeps its half of the KV heads in its own host pool
    and runs every plan's copies; tokens equal the same two ranks' without the tier."""
    options = dict(tensor_parallel_size=2)
    off = make_llm(kv_offloading_size=0, **options)
    try:
        expected = run_conversations(off, conversation_rounds())
    finally:
        off.engine.executor.shutdown()
    on = make_llm(kv_offloading_size=HOST_GIB, **options)
    try:
        assert on.engine.kv_cache_manager.host_tier.num_blocks == 200  # half the bytes a block
        assert run_conversations(on, conversation_rounds()) == expected
        stats = on.engine.get_stats()
        assert stats.host_cache_hits > 0
        assert_drained(on.engine)
    finally:
        on.engine.executor.shutdown()
