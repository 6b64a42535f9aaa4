"""Grammar, bad_words and penalty rows keep the overlapped step, with exactly the tokens of
synchronous steps.

Grammar and bad_words rows sample from host tokens: their steps launch in two halves with the
step before read in between (split_launch.py); penalty rows read their token ids on the device
(penalty_history.py) and overlap like plain rows. Async scheduling is forced on the CPU, which
runs the same machinery as CUDA. The references are runs with async scheduling off.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from ladle import LLM, SamplingParams
from ladle.executor import in_process
from ladle.protocol.messages import EngineCoreRequest

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
REGEX = "[A-Z]{2}-[0-9]{3}"


def _outputs(llm: LLM, prompts, params):
    return [
        (o.outputs[0].token_ids, o.outputs[0].finish_reason)
        for o in llm.generate(prompts, params, use_tqdm=False)
    ]


@pytest.fixture(scope="module")
def default_engines():
    return {
        mode: LLM(cpu_kv_cache_gib=0.25, async_scheduling=mode, block_size=16)
        for mode in (False, True)
    }


def test_grammar_bad_words_and_penalty_rows_beside_plain_rows(default_engines, monkeypatch):
    sync, overlapped = default_engines[False], default_engines[True]
    assert overlapped.engine.overlaps and not sync.engine.overlaps
    prompts = [
        "Describe a person as JSON:",
        "A product code:",
        "The capital of France is",
        "Once upon a time",
        "List three fruits:",
        "The weather today is",
        "My favourite number is",
    ]
    # The word greedy writes a few tokens into the third prompt: the ban must change it.
    free = _outputs(sync, prompts[2:3], SamplingParams(temperature=0, max_tokens=12))[0][0]
    word = free[3:5]
    params = [
        SamplingParams(temperature=0.8, seed=3, max_tokens=48, structured_outputs={"json": SCHEMA}),
        SamplingParams(temperature=0, max_tokens=12, structured_outputs={"regex": REGEX}),
        SamplingParams(temperature=0, max_tokens=12, bad_words_token_ids=[word]),
        SamplingParams(temperature=0, max_tokens=16, repetition_penalty=1.4, ignore_eos=True),
        SamplingParams(
            temperature=0.9, seed=5, max_tokens=16, frequency_penalty=0.8, presence_penalty=0.5
        ),
        SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=9, max_tokens=16, top_k=20),
    ]
    split_calls = []
    original_call = in_process.launch_step

    def counting_call(worker, plan, start_grammar_fill, between):
        if between is not None:  # the step before is read between forward and sampling
            split_calls.append(1)
        return original_call(worker, plan, start_grammar_fill, between)

    monkeypatch.setattr(in_process, "launch_step", counting_call)
    expected = _outputs(sync, prompts, params)
    assert not split_calls  # synchronous steps never split
    got = _outputs(overlapped, prompts, params)
    assert got == expected
    assert len(split_calls) >= 10  # the grammar rows' steps overlapped in two halves

    tokenizer = sync.get_tokenizer()
    value = json.loads(tokenizer.decode(expected[0][0], skip_special_tokens=True))
    jsonschema.validate(value, SCHEMA)
    assert re.fullmatch(REGEX, tokenizer.decode(expected[1][0], skip_special_tokens=True))
    banned = expected[2][0]
    assert banned[:4] == free[:4] and banned[4] != free[4]
    # The penalty changed the greedy row against the same prompt without it.
    plain = _outputs(
        sync, prompts[3:4], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    )[0][0]
    assert plain != expected[3][0]


@pytest.fixture(scope="module")
def qwen3(tiny_model_path):
    import random

    path = tiny_model_path("qwen3")
    rng = random.Random(4)
    prompts = [[rng.randrange(3, 200) for _ in range(n)] for n in (1, 5, 9, 17, 30, 45)]
    return path, prompts


def _penalty_params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0, max_tokens=14, repetition_penalty=1.3, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=14, ignore_eos=True),
        SamplingParams(
            temperature=0.8, seed=2, max_tokens=14, frequency_penalty=0.6, ignore_eos=True
        ),
        SamplingParams(temperature=0, max_tokens=9, presence_penalty=1.2, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=4, max_tokens=14, ignore_eos=True, logprobs=2),
        SamplingParams(
            temperature=0,
            max_tokens=14,
            repetition_penalty=0.7,
            frequency_penalty=-0.5,
            ignore_eos=True,
        ),
    ]


@pytest.mark.parametrize(
    "options",
    [{}, {"max_num_batched_tokens": 8, "enable_prefix_caching": False}, {"num_kv_blocks": 24}],
    ids=["batched", "chunked", "preempting"],
)
def test_penalty_rows_overlap_and_match_synchronous_steps(qwen3, options):
    path, prompts = qwen3
    options = {"block_size": 4, "num_kv_blocks": 400, **options}
    runs = {}
    for mode in (False, True):
        llm = LLM(path, async_scheduling=mode, **options)
        runs[mode] = [
            (
                o.outputs[0].token_ids,
                [{t: v.logprob for t, v in e.items()} for e in o.outputs[0].logprobs or []],
            )
            for o in llm.generate(prompts, _penalty_params(), use_tqdm=False)
        ]
        if mode:
            if options["num_kv_blocks"] == 24:
                assert llm.engine.get_stats().num_preemptions > 0
            history = llm.engine.executor.worker.runner.penalty_history
            assert history is not None and not history._row_of  # every row given back
    assert [tokens for tokens, _ in runs[True]] == [tokens for tokens, _ in runs[False]]
    # Logprobs to float noise: a preempted request recomputes in a batch of another shape.
    for (_, overlapped), (_, synchronous) in zip(runs[True], runs[False]):
        assert [sorted(e) for e in overlapped] == [sorted(e) for e in synchronous]
        for got, want in zip(overlapped, synchronous):
            assert got == pytest.approx(want, abs=1e-5)


def _hf_penalised_greedy(model, prompt, num_tokens, repetition, frequency, presence):
    """Greedy decoding under the three penalties, written out in plain torch over HF logits."""
    import torch

    output: list[int] = []
    with torch.no_grad():
        for _ in range(num_tokens):
            logits = model(torch.tensor([prompt + output])).logits[0, -1].clone()
            seen = torch.tensor(sorted(set(prompt + output)))
            logits[seen] = torch.where(
                logits[seen] > 0, logits[seen] / repetition, logits[seen] * repetition
            )
            for token in set(output):
                logits[token] -= frequency * output.count(token) + presence
            output.append(int(logits.argmax()))
    return output


def test_overlapped_penalty_rows_match_a_plain_torch_reference(qwen3):
    """Against HF logits with the penalties applied in the test: the device-side ids must
    hold every earlier token (both engine modes share the path, so this is the check)."""
    from helpers.tiny_models import load_hf_reference

    path, prompts = qwen3
    model = load_hf_reference(path)
    settings = [(1.3, 0.0, 0.0), (1.0, 0.6, 0.4), (0.8, -0.3, 0.5), (1.0, 0.0, 0.0)]
    params = [
        SamplingParams(
            temperature=0,
            max_tokens=10,
            ignore_eos=True,
            repetition_penalty=repetition,
            frequency_penalty=frequency,
            presence_penalty=presence,
        )
        for repetition, frequency, presence in settings
    ]
    # The longest prompt: plain greedy repeats one token there, so every penalty bites.
    batch = [prompts[5]] * 3 + [prompts[4]]
    llm = LLM(path, block_size=4, num_kv_blocks=400, async_scheduling=True)
    got = [o.outputs[0].token_ids for o in llm.generate(batch, params, use_tqdm=False)]
    expected = [
        _hf_penalised_greedy(model, prompt, 10, *setting)
        for prompt, setting in zip(batch, settings)
    ]
    assert got == expected
    # The penalties changed the greedy tokens (else this would test nothing).
    plain = _hf_penalised_greedy(model, prompts[5], 10, 1.0, 0.0, 0.0)
    assert all(plain != tokens for tokens in expected[:3])


def test_penalty_rows_arrive_one_step_late(qwen3):
    """A penalty request's steps overlap: its first step's outputs come with the next step."""
    path, prompts = qwen3
    llm = LLM(path, block_size=4, num_kv_blocks=400, async_scheduling=True)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=6, repetition_penalty=1.5, ignore_eos=True)
    engine.add_request(
        EngineCoreRequest(request_id="p", prompt_token_ids=prompts[3], sampling_params=params)
    )
    assert engine.step() == []  # launched, not read
    tokens = []
    while engine.has_unfinished_requests():
        tokens += [t for output in engine.step() for t in output.new_token_ids]
    sync = LLM(path, block_size=4, num_kv_blocks=400, async_scheduling=False)
    assert tokens == sync.generate([prompts[3]], params, use_tqdm=False)[0].outputs[0].token_ids


def test_a_request_that_breaks_a_split_step_ends_alone(qwen3, monkeypatch):
    """Fault isolation around a split launch: the step in flight is read once, the culprit
    ends with an error, and the other requests (one with bad_words, so steps split) keep
    exactly their tokens."""
    path, prompts = qwen3
    poison = 13
    params = [
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, bad_words_token_ids=[[7]]),
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
    ]

    def run(add_poison: bool) -> dict[str, list[int]]:
        llm = LLM(path, block_size=4, num_kv_blocks=400, async_scheduling=True)
        engine = llm.engine
        launch_forward = engine.executor.worker.launch_forward
        states = engine.executor.worker.runner.states

        def faulty(plan):
            prompts = {new.request_id: new.prompt_token_ids for new in plan.new_requests}
            for scheduled in plan.scheduled:
                request_id = scheduled.request_id
                prompt = prompts.get(request_id) or (
                    states[request_id].prompt_token_ids if request_id in states else []
                )
                if prompt and prompt[0] == poison:
                    raise ValueError("simulated failure")
            return launch_forward(plan)

        monkeypatch.setattr(engine.executor.worker, "launch_forward", faulty)
        for index, request_params in enumerate(params):
            engine.add_request(
                EngineCoreRequest(
                    request_id=f"good{index}",
                    prompt_token_ids=prompts[3 + index],
                    sampling_params=request_params,
                )
            )
        tokens: dict[str, list[int]] = {}
        finish: dict[str, str | None] = {}
        for step in range(100):
            if step == 3 and add_poison:  # arrives while a split step is in flight
                assert engine._in_flight is not None
                engine.add_request(
                    EngineCoreRequest(
                        request_id="poison",
                        prompt_token_ids=[poison, 5, 6],
                        sampling_params=params[1],
                    )
                )
            for output in engine.step():
                tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
                if output.finished:
                    finish[output.request_id] = output.finish_reason
            if not engine.has_unfinished_requests():
                break
        if add_poison:
            assert finish["poison"] == "error"
        assert finish["good0"] == finish["good1"] == "length"
        return {key: value for key, value in tokens.items() if key != "poison"}

    assert run(add_poison=True) == run(add_poison=False)
