"""Sampling through the whole engine: seeds are batch-invariant, n samples, stops, logprobs."""

from __future__ import annotations

import math

import pytest

from ladle import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_model_path):
    return LLM(tiny_model_path("qwen2"), block_size=4, num_kv_blocks=400)


PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [40, 41, 42, 43, 44, 45, 46, 47, 48], [3]]


def texts_and_ids(outputs):
    return [[(c.text, tuple(c.token_ids)) for c in o.outputs] for o in outputs]


def test_same_seed_same_tokens_whatever_the_batch(llm):
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=12, ignore_eos=True)
    alone = llm.generate([PROMPTS[2]], seeded, use_tqdm=False)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    mixed = llm.generate(
        [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3]],
        [others, others, seeded, others],
        use_tqdm=False,
    )
    assert mixed[2].outputs[0].token_ids == alone
    different = SamplingParams(
        temperature=1.0, top_p=0.9, seed=4321, max_tokens=12, ignore_eos=True
    )
    assert llm.generate([PROMPTS[2]], different, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_n_samples(llm):
    params = SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    output = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0]
    assert [c.index for c in output.outputs] == [0, 1, 2, 3]
    assert all(len(c.token_ids) == 10 for c in output.outputs)
    assert len({tuple(c.token_ids) for c in output.outputs}) > 1
    # Sample 0 keeps the request's seed: it equals the n=1 result with that seed.
    single = SamplingParams(n=1, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    assert (
        llm.generate([PROMPTS[0]], single, use_tqdm=False)[0].outputs[0].token_ids
        == output.outputs[0].token_ids
    )


def test_stop_token_ids_and_stop_strings(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    reference = llm.generate([PROMPTS[1]], greedy, use_tqdm=False)[0].outputs[0]
    stop_id = reference.token_ids[5]
    first = reference.token_ids.index(stop_id)
    stopped = llm.generate(
        [PROMPTS[1]],
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop_token_ids=[stop_id]),
        use_tqdm=False,
    )[0].outputs[0]
    assert stopped.token_ids == reference.token_ids[: first + 1]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == stop_id

    text = reference.text
    assert len(text) > 6
    stop_string = text[3:6]
    cut = text.index(stop_string)
    by_string = llm.generate(
        [PROMPTS[1]],
        SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=[stop_string]),
        use_tqdm=False,
    )[0].outputs[0]
    assert by_string.text == text[:cut]
    assert by_string.finish_reason == "stop" and by_string.stop_reason == stop_string
    stats = llm.engine.get_stats()
    assert stats.num_running_reqs == 0 and stats.num_free_blocks == stats.num_total_blocks


def test_min_tokens_and_max_tokens(llm):
    eos = llm.tokenizer.eos_token_ids
    params = SamplingParams(temperature=1.0, seed=3, max_tokens=8, min_tokens=8)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    for output in outputs:
        completion = output.outputs[0]
        assert len(completion.token_ids) == 8
        assert not set(completion.token_ids[:7]) & set(eos)
        assert completion.finish_reason in ("length", "stop")


def test_logprobs_match_greedy_choice(llm):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3)
    completion = llm.generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0]
    # vLLM's shape: one {token_id: Logprob} dict per token, the sampled token first.
    assert len(completion.logprobs) == 6
    for token_id, position in zip(completion.token_ids, completion.logprobs):
        assert next(iter(position)) == token_id
        assert position[token_id].rank == 1  # greedy picks the most likely token
        assert len(position) == 3
        values = [entry.logprob for entry in position.values()]
        assert [entry.rank for entry in position.values()] == [1, 2, 3]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-5
        assert position[token_id].decoded_token == llm.tokenizer.decode(
            [token_id], skip_special_tokens=False
        )
    expected_sum = sum(
        position[token_id].logprob
        for token_id, position in zip(completion.token_ids, completion.logprobs)
    )
    assert math.isclose(completion.cumulative_logprob, expected_sum, rel_tol=1e-6)


def test_sampled_token_logprob_alone_matches_top_k_and_the_prompt_logprobs_reference(llm):
    """`logprobs: 0` (every token-id stream of `ladle bench serve`) takes the sampler's short
    path and the runner's packed copy: the seeded tokens are those of a request without
    logprobs, the sampled logprob and rank those a top-3 request reports, and the logprob the
    model's own log-softmax at that position (the prompt logprobs of prompt + output)."""
    def run(num_logprobs):
        params = SamplingParams(
            temperature=0.8, seed=7, max_tokens=10, ignore_eos=True, logprobs=num_logprobs
        )
        return llm.generate([PROMPTS[2]], params, use_tqdm=False)[0].outputs[0]

    plain, alone, top = run(None), run(0), run(3)
    assert alone.token_ids == plain.token_ids == top.token_ids
    assert len(alone.logprobs) == len(alone.token_ids)
    for token_id, only, with_top in zip(alone.token_ids, alone.logprobs, top.logprobs):
        assert list(only) == [token_id]
        assert only[token_id].logprob == with_top[token_id].logprob
        assert only[token_id].rank == with_top[token_id].rank
    sequence = PROMPTS[2] + list(alone.token_ids)
    reference = llm.generate(
        [sequence], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
    )[0].prompt_logprobs
    for index, token_id in enumerate(alone.token_ids):
        expected = reference[len(PROMPTS[2]) + index][token_id]
        assert math.isclose(alone.logprobs[index][token_id].logprob, expected.logprob,
                            rel_tol=1e-4, abs_tol=1e-4)
        assert alone.logprobs[index][token_id].rank == expected.rank
