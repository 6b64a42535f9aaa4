"""Completions' legacy `top_logprobs` hold the chosen token and the `logprobs` most likely ones
(OpenAI: "up to logprobs+1 elements"; vLLM alike), for generated and echoed prompt tokens,
streamed or not: checked against the offline LLM's vLLM-shaped Logprob dicts."""

from __future__ import annotations

import pytest

from ladle import SamplingParams
from tests.entrypoints.conftest import SERVED_NAME

PROMPT = "The quick brown fox"
MAX_TOKENS = 5


def _expected_tops(offline_llm, num_top: int) -> list[dict[str, float]]:
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True,
                            logprobs=num_top)
    output = offline_llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
    decode = offline_llm.get_tokenizer().decode
    return [
        {decode([token_id]): entry.logprob for token_id, entry in position.items()}
        for position in output.logprobs
    ]


def _assert_close(got: list[dict[str, float]], expected: list[dict[str, float]]) -> None:
    assert [set(top) for top in got] == [set(top) for top in expected]
    for got_top, expected_top in zip(got, expected, strict=True):
        for text, logprob in expected_top.items():
            assert got_top[text] == pytest.approx(logprob, abs=1e-4)


@pytest.mark.parametrize("num_top", [0, 2])
@pytest.mark.parametrize("stream", [False, True])
def test_top_logprobs_hold_the_chosen_token(openai_client, offline_llm, num_top, stream):
    response = openai_client.completions.create(
        model=SERVED_NAME, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0,
        logprobs=num_top, stream=stream, extra_body={"ignore_eos": True},
    )
    chunks = response if stream else [response]
    tokens, tops = [], []
    for chunk in chunks:
        for choice in chunk.choices:
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens
                tops += choice.logprobs.top_logprobs
    expected = _expected_tops(offline_llm, num_top)
    _assert_close(tops, expected)
    assert all(len(top) <= num_top + 1 for top in tops)
    assert all(token in top for token, top in zip(tokens, tops, strict=True))


def test_echoed_prompt_tokens_hold_themselves_too(openai_client):
    response = openai_client.completions.create(
        model=SERVED_NAME, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1, echo=True,
    )
    logprobs = response.choices[0].logprobs
    assert logprobs.top_logprobs[0] is None  # nothing predicts the first prompt token
    for token, token_logprob, top in zip(
        logprobs.tokens[1:], logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True
    ):
        assert top[token] == token_logprob and 1 <= len(top) <= 2


@pytest.mark.parametrize("echo", [False, True])
@pytest.mark.parametrize("by_id", [False, True])
def test_text_offsets_count_each_tokens_text_streamed_or_not(
    openai_client, offline_llm, echo, by_id
):
    """text_offset is where each token's own text starts, counted through the echoed prompt;
    streamed offsets equal the whole response's whatever the chunks held (a token that is part
    of a character holds the streamed text back), and `token_id:N` names do not move them."""
    body = dict(
        model=SERVED_NAME, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=0,
        echo=echo,
        extra_body={"ignore_eos": True, "return_token_ids": True,
                    "return_tokens_as_token_ids": by_id},
    )
    choice = openai_client.completions.create(**body).choices[0]
    token_ids = (choice.prompt_token_ids if echo else []) + choice.token_ids
    decode = offline_llm.get_tokenizer().decode
    expected, offset = [], 0
    for token_id in token_ids:
        expected.append(offset)
        offset += len(decode([token_id]))
    assert choice.logprobs.text_offset == expected
    streamed = [
        start
        for chunk in openai_client.completions.create(**body, stream=True)
        for streamed_choice in chunk.choices
        if streamed_choice.logprobs is not None
        for start in streamed_choice.logprobs.text_offset
    ]
    assert streamed == expected
