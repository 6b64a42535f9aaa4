"""Speculative decoding end to end on the CPU in fp32 (tiny random llama): the tokens with
drafts equal the tokens without, for every proposer, greedy and seeded; grammar, penalties,
logprobs, stop strings, EOS and max_tokens inside accepted drafts; bad configs refused by field.

Prompts repeat themselves so prompt lookup finds matches, and random weights loop, so drafts are
accepted often: every test checks that the run really verified and accepted drafts."""

from __future__ import annotations

import pytest
from helpers.spec_prompts import first_token_ids, reference_token_ids, repetitive_prompts

from ladle import LLM, SamplingParams

ENGINE_OPTIONS = {"cpu_kv_cache_gib": 0.1, "block_size": 4, "max_num_seqs": 64}
METHODS = ["ngram", "suffix"]

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}




@pytest.fixture(scope="module")
def model_path(tiny_model_path):
    return tiny_model_path("llama")


@pytest.fixture(scope="module")
def engine_off(model_path):
    return LLM(model_path, **ENGINE_OPTIONS)


@pytest.fixture(scope="module")
def engines(model_path):
    """One engine per (method, adaptive), made once for the module."""
    return {
        (method, adaptive): LLM(
            model_path,
            speculative_config={
                "method": method, "num_speculative_tokens": 4, "adaptive": adaptive
            },
            **ENGINE_OPTIONS,
        )
        for method in METHODS
        for adaptive in (False, True)
    }


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("method", METHODS)
def test_greedy_tokens_equal_those_without_speculation(engines, engine_off, method, adaptive):
    prompts = repetitive_prompts(96)
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    expected = first_token_ids(engine_off.generate(prompts, params, use_tqdm=False))
    llm = engines[(method, adaptive)]
    before = llm.engine.get_stats().spec_decode
    got = first_token_ids(llm.generate(prompts, params, use_tqdm=False))
    assert got == expected
    stats = llm.engine.get_stats().spec_decode
    if not adaptive:
        # (Adaptive at batch 96 on the CPU drafts little: tokens cost their share there.)
        assert stats.num_accepted_tokens - before.num_accepted_tokens > 100
        assert stats.num_draft_tokens > stats.num_accepted_tokens  # some were rejected too
    stats_blocks = llm.engine.get_stats()
    assert stats_blocks.num_free_blocks == stats_blocks.num_total_blocks


@pytest.mark.parametrize("method", METHODS)
def test_seeded_requests_are_batch_invariant(engines, engine_off, method):
    """A seeded request gives the same tokens alone, in a batch, and without speculation."""
    llm = engines[(method, True)]
    prompts = repetitive_prompts(12)
    seeded = [
        SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=24, ignore_eos=True)
        for i in range(len(prompts))
    ]
    together = first_token_ids(llm.generate(prompts, seeded, use_tqdm=False))
    alone = [
        first_token_ids(llm.generate([p], [s], use_tqdm=False))[0]
        for p, s in zip(prompts, seeded)
    ]
    without = first_token_ids(engine_off.generate(prompts, seeded, use_tqdm=False))
    assert together == alone == without


def _feature_params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=40, structured_outputs={"json": SCHEMA}),
        SamplingParams(temperature=0, max_tokens=24, repetition_penalty=1.3, presence_penalty=0.4,
                       frequency_penalty=0.2, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=24, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),  # max_tokens in drafts
        SamplingParams(temperature=0.7, seed=5, max_tokens=24, logprobs=2, top_k=20,
                       min_p=0.02, logit_bias={7: 2.0}, ignore_eos=True),
    ]


def _assert_same(got, expected):
    """Same tokens, text, finish and logprob candidates; logprob values to fp32 noise (a step
    that verifies drafts computes the same rows in a matmul of another shape)."""
    assert [g[:3] for g in got] == [e[:3] for e in expected]
    for g, e in zip(got, expected):
        assert [sorted(step) for step in g[3]] == [sorted(step) for step in e[3]]
        for got_step, expected_step in zip(g[3], e[3]):
            for token, logprob in expected_step.items():
                assert got_step[token] == pytest.approx(logprob, abs=1e-3)


def _details(outputs):
    return [
        (
            list(o.outputs[0].token_ids),
            o.outputs[0].text,
            o.outputs[0].finish_reason,
            [
                {token: entry.logprob for token, entry in step.items()}
                for step in (o.outputs[0].logprobs or [])
            ],
        )
        for o in outputs
    ]


@pytest.mark.parametrize("method", METHODS)
def test_grammar_penalties_logprobs_and_limits_with_drafts(engines, engine_off, method):
    params = _feature_params() * 6
    prompts = repetitive_prompts(len(params))
    expected = _details(engine_off.generate(prompts, params, use_tqdm=False))
    llm = engines[(method, False)]
    before = llm.engine.get_stats().spec_decode.num_accepted_tokens
    got = _details(llm.generate(prompts, params, use_tqdm=False))
    _assert_same(got, expected)
    assert llm.engine.get_stats().spec_decode.num_accepted_tokens - before > 10
    assert expected[0][1].startswith('{"')  # the grammar row follows its schema
    assert expected[3][2] == "length" and len(expected[3][0]) == 7
    assert len(expected[2][3]) == 24 and len(expected[2][3][0]) >= 3  # logprobs per token


@pytest.mark.parametrize("method", METHODS)
def test_stop_strings_and_eos_inside_accepted_drafts(engines, engine_off, method):
    """Stop at a token the reference run emits mid-way and that the prompt holds (so prompt
    lookup drafts it): as a stop token id (EOS ends a request in the same check of the
    scheduler, one branch above) and as a stop string (the output processor's). Every run ends
    where the one-token run ends, and some ended inside a multi-token result."""
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
    text = reference[0].outputs[0].text
    params[0] = SamplingParams(temperature=0, max_tokens=32, stop=[text[len(text) // 2 :][:3]])
    expected = _details(engine_off.generate(prompts, params, use_tqdm=False))
    llm = engines[(method, False)]
    scheduler = llm.engine.scheduler
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
        got = _details(llm.generate(prompts, params, use_tqdm=False))
    finally:
        del scheduler.update_from_output
    _assert_same(got, expected)
    assert all(finish == "stop" for _, _, finish, _ in expected)
    assert len(ended_in_a_run) >= 3


@pytest.mark.parametrize("method", METHODS)
def test_bad_words_see_the_drafts_before_a_row_as_outputs(engines, engine_off, method):
    """bad_words bans a word's last token once the output ends with the rest of it: a row
    after drafts must see them as outputs (its request's output ids plus the drafts before
    it), or a word that ends inside a drafted run is not banned there. Each request bans a
    pair its greedy output writes; the tokens equal those without speculation, and the bans
    change the outputs."""
    prompts = repetitive_prompts(12, seed=3)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    reference = first_token_ids(engine_off.generate(prompts, greedy, use_tqdm=False))
    params = [
        SamplingParams(
            temperature=0, max_tokens=24, ignore_eos=True,
            bad_words_token_ids=[tokens[index : index + 2]],
        )
        for index, tokens in zip(range(3, 100), reference)
    ]  # fmt: skip
    expected = first_token_ids(engine_off.generate(prompts, params, use_tqdm=False))
    llm = engines[(method, False)]
    before = llm.engine.get_stats().spec_decode.num_accepted_tokens
    got = first_token_ids(llm.generate(prompts, params, use_tqdm=False))
    assert got == expected
    assert sum(e != r for e, r in zip(expected, reference)) >= len(prompts) // 2
    assert llm.engine.get_stats().spec_decode.num_accepted_tokens - before > 10


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"method": "eagle3", "num_speculative_tokens": 3}, "speculative_config.model is required"),
        ({"method": "draft_model"}, "speculative_config.model is required"),
        ({"method": "mtp"}, "method='mtp' is not yet supported"),
        ({"method": "medusa2"}, "speculative_config.method must be one of"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens"),
        ({"method": "ngram", "num_speculative_tokens": 17}, "num_speculative_tokens"),
        ({"method": "ngram", "lookahead": 2}, "unknown key(s) 'lookahead'"),
        ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min"),
        ({"num_speculative_tokens": 2}, "speculative_config.method is required"),
        ({"method": "ngram", "synthetic_acceptance": 1.5}, "synthetic_acceptance"),
    ],
)
def test_bad_speculative_configs_are_refused_by_field(config, message):
    with pytest.raises(ValueError) as error:
        LLM("tiny-llama", load_format="dummy", speculative_config=config)
    assert message in str(error.value)


@pytest.mark.parametrize("method", METHODS)
def test_overlapped_steps_with_adaptive_speculation(model_path, engine_off, method):
    """With overlapped scheduling, requests the adaptive rule does not draft for run with their
    token in flight and drafted ones wait for theirs: the tokens are still those without
    speculation, and both kinds of step happened."""
    llm = LLM(
        model_path,
        async_scheduling=True,
        speculative_config={"method": method, "num_speculative_tokens": 4},
        **ENGINE_OPTIONS,
    )
    assert llm.engine.overlaps
    prompts = repetitive_prompts(48)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    expected = first_token_ids(engine_off.generate(prompts, params, use_tqdm=False))
    builder = llm.engine.executor.worker.runner.input_builder
    original = builder.build
    device_reads = 0

    def counting_build(*args, **kwargs):
        nonlocal device_reads
        inputs = original(*args, **kwargs)
        device_reads += inputs.token_slots is not None
        return inputs

    builder.build = counting_build
    try:
        got = first_token_ids(llm.generate(prompts, params, use_tqdm=False))
        single = first_token_ids(llm.generate(prompts[:1], params, use_tqdm=False))
    finally:
        builder.build = original
    assert got == expected and single == expected[:1]
    assert device_reads > 0  # some decodes read their input id on the device (overlapped)
    assert llm.engine.get_stats().spec_decode.num_drafts > 0  # and some steps verified drafts


@pytest.mark.parametrize(
    "options",
    [dict(distributed_executor_backend="mp"), dict(tensor_parallel_size=2),
     dict(pipeline_parallel_size=2)],
    ids=["worker-process", "tp2", "pp2"],
)
def test_speculation_through_worker_processes(model_path, engine_off, options):
    """Drafts cross to worker processes in the plan (one rank, then two tensor-parallel ranks
    over gloo, then two pipeline stages): the tokens are those of the engine without
    speculation. Under pipeline parallelism the first stage takes each request's next input
    token from the device copy of the last stage's rows, which for a verify step are several:
    the one the request goes on from is the last emitted, not the last row copied (it took the
    wrong one; tensor-parallel ranks did too when they launched a step before reading the one
    before, which timing decides: worker/test_last_emitted.py pins the rule)."""
    llm = LLM(
        model_path,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3, "adaptive": False},
        **ENGINE_OPTIONS,
        **options,
    )
    prompts = repetitive_prompts(16)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = reference_token_ids(
        engine_off, model_path, options, prompts, params, **ENGINE_OPTIONS
    )
    try:
        got = first_token_ids(llm.generate(prompts, params, use_tqdm=False))
        assert got == expected
        assert llm.engine.get_stats().spec_decode.num_accepted_tokens > 20
    finally:
        llm.engine.executor.shutdown()
