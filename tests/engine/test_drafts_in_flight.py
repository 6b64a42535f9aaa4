"""Drafted requests planned while their verify step is in flight (n-gram drafts made on the
device, core/drafts_in_flight.py, worker/drafts_on_device.py), on the CPU in fp32 with overlap
forced on: the tokens equal those without speculation; the steps really overlap; EOS, stop ids
and max_tokens inside accepted drafts end at the right token; aborts leak no KV block."""

from __future__ import annotations

import pytest
from helpers.emulated_graphs import install_emulated_graphs
from helpers.spec_prompts import first_token_ids, reference_token_ids, repetitive_prompts

from ladle import LLM, SamplingParams
from ladle.config import EngineConfig, SpeculativeConfig
from ladle.protocol.messages import EngineCoreRequest
from ladle.spec_decode.placement import drafts_on_device

ENGINE_OPTIONS = {"cpu_kv_cache_gib": 0.1, "block_size": 4, "max_num_seqs": 64}
# Device drafts are the GPU's default only (spec_decode/placement.py): these CPU tests ask.
NGRAM = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "adaptive": False,
    "drafts_on_device": True,
}


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
    prompts = repetitive_prompts(40)
    params = [
        SamplingParams(temperature=0, max_tokens=8 + 5 * (i % 7), ignore_eos=True)
        for i in range(len(prompts))
    ]
    expected = first_token_ids(engine_off.generate(prompts, params, use_tqdm=False))
    before = engine_in_flight.engine.get_stats().spec_decode
    got = first_token_ids(engine_in_flight.generate(prompts, params, use_tqdm=False))
    alone = first_token_ids(engine_in_flight.generate(prompts[:1], params[:1], use_tqdm=False))
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
        in_flight = engine.in_flight_plans
        plan = original()
        for unread in in_flight:
            verifying = {s.request_id for s in unread.scheduled if s.draft_token_ids}
            for scheduled in plan.scheduled:
                if scheduled.request_id in verifying and scheduled.draft_token_ids:
                    assert scheduled.num_unverified_before > 0
                    overlapped.append(scheduled.request_id)
        return plan

    engine.scheduler.schedule = watching_schedule
    try:
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        engine_in_flight.generate(repetitive_prompts(4, seed=1), params, use_tqdm=False)
    finally:
        engine.scheduler.schedule = original
    assert len(overlapped) > 10


def test_seeded_requests_are_batch_invariant(engine_in_flight, engine_off):
    """A seeded request's random stream counter is moved back on the device with its step:
    the same tokens alone, in a batch, and without speculation."""
    prompts = repetitive_prompts(10, seed=2)
    seeded = [
        SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=20, ignore_eos=True)
        for i in range(len(prompts))
    ]
    together = first_token_ids(engine_in_flight.generate(prompts, seeded, use_tqdm=False))
    alone = [
        first_token_ids(engine_in_flight.generate([p], [s], use_tqdm=False))[0]
        for p, s in zip(prompts[:4], seeded[:4])
    ]
    without = first_token_ids(engine_off.generate(prompts, seeded, use_tqdm=False))
    assert together == without and alone == without[:4]


def _details(outputs):
    return [
        (
            list(o.outputs[0].token_ids),
            o.outputs[0].text,
            o.outputs[0].finish_reason,
            [sorted(step) for step in (o.outputs[0].logprobs or [])],
        )
        for o in outputs
    ]


def test_host_bound_requests_beside_in_flight_ones(engine_in_flight, engine_off):
    """Grammar, penalty and min_tokens requests stay synchronous beside the overlapped ones;
    logprobs, max_tokens inside drafts and seeded sampling overlap: all as without drafts."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    params = [
        SamplingParams(temperature=0, max_tokens=40, structured_outputs={"json": schema}),
        SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=24, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=20, min_tokens=12),
        SamplingParams(temperature=0.7, seed=5, max_tokens=24, top_k=20, ignore_eos=True),
    ] * 3
    prompts = repetitive_prompts(len(params), seed=3)
    expected = _details(engine_off.generate(prompts, params, use_tqdm=False))
    got = _details(engine_in_flight.generate(prompts, params, use_tqdm=False))
    assert got == expected
    assert expected[3][2] == "length" and len(expected[3][0]) == 7
    _assert_no_blocks_held(engine_in_flight)


def test_stop_ids_inside_accepted_drafts_end_at_the_right_token(engine_in_flight, engine_off):
    """A stop id the prompt holds (so the n-gram drafts it) ends the request at that token,
    also inside a multi-token result, while its next step is already in flight."""
    prompts = repetitive_prompts(32)
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    reference = engine_off.generate(prompts, greedy, use_tqdm=False)
    params = []
    for prompt, output in zip(prompts, reference):
        tokens = list(output.outputs[0].token_ids)
        seen = set(prompt["prompt_token_ids"])
        stop_at = next(
            (i for i in range(3, len(tokens)) if tokens[i] in seen and tokens[i] not in tokens[:i]),
            len(tokens) // 2,
        )
        params.append(
            SamplingParams(temperature=0, max_tokens=32, stop_token_ids=[tokens[stop_at]])
        )
    expected = _details(engine_off.generate(prompts, params, use_tqdm=False))
    scheduler = engine_in_flight.engine.scheduler
    ended_in_a_run = []
    original_update = scheduler.update_from_output

    def watching_update(plan, result):
        outputs = original_update(plan, result)
        ended_in_a_run.extend(
            o for o in outputs if o.finish_reason == "stop" and len(o.new_token_ids) > 1
        )
        return outputs

    scheduler.update_from_output = watching_update
    try:
        got = _details(engine_in_flight.generate(prompts, params, use_tqdm=False))
    finally:
        del scheduler.update_from_output
    assert got == expected
    assert all(finish == "stop" for _, _, finish, _ in expected)
    assert len(ended_in_a_run) >= 3
    _assert_no_blocks_held(engine_in_flight)


def test_aborts_mid_flight_leak_no_block(engine_in_flight):
    """Requests aborted while two of their steps are unread free every block."""
    engine = engine_in_flight.engine
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i, prompt in enumerate(repetitive_prompts(6, seed=5)):
        engine.add_request(
            EngineCoreRequest(
                request_id=f"abort-{i}",
                prompt_token_ids=prompt["prompt_token_ids"],
                sampling_params=params,
                eos_token_ids=[],
            )
        )
    aborted_in_flight = 0
    for step in range(12):
        engine.step()
        if step in (4, 7):
            ids = [r for r in list(engine.scheduler.requests) if r.startswith("abort-")][:3]
            aborted_in_flight += sum(
                engine.scheduler.requests[r].num_pending_tokens > 0 for r in ids
            )
            engine.abort_requests(ids)
    while engine.has_unfinished_requests():
        engine.step()
    assert aborted_in_flight > 0
    _assert_no_blocks_held(engine_in_flight)


def test_preemption_with_steps_in_flight(model_path, engine_off):
    """A pool too small for the batch preempts requests whose drafted steps are in flight:
    they resume from their read tokens and still give the tokens without speculation."""
    llm = LLM(
        model_path,
        async_scheduling=True,
        speculative_config=NGRAM,
        block_size=4,
        num_kv_blocks=48,
        max_num_seqs=16,
    )
    prompts = repetitive_prompts(16, seed=6)
    params = SamplingParams(temperature=0, max_tokens=28, ignore_eos=True)
    expected = first_token_ids(engine_off.generate(prompts, params, use_tqdm=False))
    got = first_token_ids(llm.generate(prompts, params, use_tqdm=False))
    assert got == expected
    assert llm.engine.get_stats().num_preemptions > 0
    _assert_no_blocks_held(llm)


def test_drafts_on_device_is_a_config_choice(model_path):
    """drafts_on_device: false keeps host drafts (drafted steps synchronous); a non-boolean is
    refused by name."""
    llm = LLM(
        model_path,
        async_scheduling=True,
        speculative_config={**NGRAM, "drafts_on_device": False},
        **ENGINE_OPTIONS,
    )
    assert llm.engine.overlaps and not llm.engine.scheduler.drafts_on_device
    assert llm.engine.executor.worker.runner.device_drafts is None
    with pytest.raises(ValueError, match="speculative_config.drafts_on_device"):
        SpeculativeConfig.from_dict({**NGRAM, "drafts_on_device": "yes"})


def test_drafts_go_on_the_device_by_default_on_a_gpu_only():
    """Unset, n-gram drafts are made on a GPU (measured faster there) and on the host of a CPU
    engine; an explicit choice holds on either; other methods and pipelines stay on the host."""
    ngram = {key: value for key, value in NGRAM.items() if key != "drafts_on_device"}

    def placed(device_type: str, **changes) -> bool:
        config = EngineConfig.from_kwargs(
            async_scheduling=True, speculative_config={**ngram, **changes}
        )
        return drafts_on_device(config, device_type)

    assert placed("cuda") and not placed("cpu")
    assert placed("cpu", drafts_on_device=True) and not placed("cuda", drafts_on_device=False)
    assert not placed("cuda", method="suffix")


@pytest.mark.parametrize(
    "options",
    [dict(distributed_executor_backend="mp"), dict(tensor_parallel_size=2)],
    ids=["worker-process", "tp2"],
)
def test_drafts_in_flight_through_worker_processes(model_path, engine_off, options):
    """Each worker keeps the device state itself (every rank samples alike, and the synthetic
    coins would follow one seed): the tokens are those without speculation."""
    llm = LLM(
        model_path, async_scheduling=True, speculative_config=NGRAM, **ENGINE_OPTIONS, **options
    )
    prompts = repetitive_prompts(12, seed=7)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = reference_token_ids(
        engine_off, model_path, options, prompts, params, **ENGINE_OPTIONS
    )
    try:
        assert llm.engine.scheduler.drafts_on_device
        got = first_token_ids(llm.generate(prompts, params, use_tqdm=False))
        assert got == expected
        assert llm.engine.get_stats().spec_decode.num_accepted_tokens > 20
    finally:
        llm.engine.executor.shutdown()


def test_moved_back_decode_steps_replay_the_decode_graphs(model_path, engine_off):
    """A decode step planned behind an unread verify step (no drafts of its own: max_tokens
    leaves no room) takes the decode graph path, its inputs copied from the moved device
    tensors, not written by the host (emulated graphs on the CPU)."""
    llm = LLM(model_path, async_scheduling=True, speculative_config=NGRAM, **ENGINE_OPTIONS)
    install_emulated_graphs(llm.engine.executor.worker)
    runner = llm.engine.executor.worker.runner
    original = runner._launch_forward
    moved_back_decodes = graphed = 0

    def watching_launch(plan):
        nonlocal moved_back_decodes, graphed
        before = runner.num_graph_steps
        forward = original(plan)
        if plan.scheduled and all(
            s.num_unverified_before and not s.draft_token_ids for s in plan.scheduled
        ):
            moved_back_decodes += 1
            graphed += runner.num_graph_steps - before
        return forward

    runner._launch_forward = watching_launch
    prompts = repetitive_prompts(6, seed=8)
    params = SamplingParams(temperature=0, max_tokens=17, ignore_eos=True)
    expected = first_token_ids(engine_off.generate(prompts, params, use_tqdm=False))
    for prompt, tokens in zip(prompts, expected):  # one at a time: the steps are its alone
        assert first_token_ids(llm.generate([prompt], params, use_tqdm=False)) == [tokens]
    assert moved_back_decodes > 0 and graphed == moved_back_decodes


def test_verify_steps_replay_the_prefill_graphs(model_path, engine_off):
    """Verify steps (k + 1 tokens a request) fit the prefill graphs' buckets: with those graphs
    (emulated on the CPU, padding requests and all) their tokens equal those without
    speculation, and the drafted steps really replayed a prefill graph."""
    llm = LLM(model_path, async_scheduling=True, speculative_config=NGRAM, **ENGINE_OPTIONS)
    worker = llm.engine.executor.worker
    install_emulated_graphs(worker, prefill=True)
    prefill = worker.runner.graph_buckets.prefill
    assert prefill is not None and prefill.buckets
    original = prefill.run
    drafted_replays = 0

    def counting_run(bucket, input_ids, positions, metadata):
        nonlocal drafted_replays
        starts = metadata.query_start_loc_host
        lengths = [b - a for a, b in zip(starts, starts[1:])]
        if all(1 < length <= NGRAM["num_speculative_tokens"] + 1 for length in lengths):
            drafted_replays += 1
        return original(bucket, input_ids, positions, metadata)

    prefill.run = counting_run
    try:
        prompts = repetitive_prompts(6, seed=11)
        params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
        expected = first_token_ids(engine_off.generate(prompts, params, use_tqdm=False))
        for prompt, tokens in zip(prompts, expected):  # one at a time: batch-1 verify steps
            assert first_token_ids(llm.generate([prompt], params, use_tqdm=False)) == [tokens]
        got = first_token_ids(llm.generate(prompts, params, use_tqdm=False))  # all at once
        assert got == expected
        assert drafted_replays > 0
        assert llm.engine.get_stats().spec_decode.num_accepted_tokens > 20
    finally:
        prefill.run = original
    _assert_no_blocks_held(llm)
