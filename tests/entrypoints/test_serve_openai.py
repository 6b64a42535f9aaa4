"""The official openai client against a real `ladle serve` (tiny llama): completions and chat,
streaming and not, n, stop, logprobs, seed, usage, auth; greedy text equals the offline LLM's."""

from __future__ import annotations

import httpx
import openai
import pytest

from ladle import SamplingParams
from tests.entrypoints.conftest import API_KEY, SERVED_NAME

PROMPTS = ["Hello, world!", "The quick brown fox", "Once upon a time there was",
           "What is the capital of France? Paris is"]
CONVERSATIONS = [
    [{"role": "user", "content": "What is two plus two?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
]
MAX_TOKENS = 12


def greedy(max_tokens: int = MAX_TOKENS) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens)


def stream_text(stream) -> tuple[str, str | None, object]:
    text, finish_reason, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            piece = choice.delta.content if hasattr(choice, "delta") else choice.text
            text += piece or ""
            finish_reason = choice.finish_reason or finish_reason
    return text, finish_reason, usage


def test_models_health_version(tiny_server, openai_client):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == [SERVED_NAME]
    assert httpx.get(f"{tiny_server.base_url}/health").status_code == 200
    assert httpx.get(f"{tiny_server.base_url}/version").json()["version"]


def test_completions_match_offline(openai_client, offline_llm):
    expected = offline_llm.generate(PROMPTS, greedy(), use_tqdm=False)
    for prompt, offline in zip(PROMPTS, expected, strict=True):
        response = openai_client.completions.create(
            model=SERVED_NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
        )
        choice = response.choices[0]
        assert choice.text == offline.outputs[0].text
        assert choice.finish_reason == offline.outputs[0].finish_reason
        assert response.usage.prompt_tokens == len(offline.prompt_token_ids)
        assert response.usage.completion_tokens == len(offline.outputs[0].token_ids)
        assert response.usage.total_tokens == (
            response.usage.prompt_tokens + response.usage.completion_tokens
        )
        stream = openai_client.completions.create(
            model=SERVED_NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
        text, finish_reason, usage = stream_text(stream)
        assert text == offline.outputs[0].text
        assert finish_reason == offline.outputs[0].finish_reason
        assert usage.completion_tokens == response.usage.completion_tokens


def test_chat_matches_offline(openai_client, offline_llm):
    expected = offline_llm.chat(CONVERSATIONS, greedy(), use_tqdm=False)
    for messages, offline in zip(CONVERSATIONS, expected, strict=True):
        response = openai_client.chat.completions.create(
            model=SERVED_NAME, messages=messages, max_tokens=MAX_TOKENS, temperature=0
        )
        assert response.choices[0].message.role == "assistant"
        assert response.choices[0].message.content == offline.outputs[0].text
        assert response.usage.prompt_tokens == len(offline.prompt_token_ids)
        stream = openai_client.chat.completions.create(
            model=SERVED_NAME, messages=messages, max_completion_tokens=MAX_TOKENS,
            temperature=0, stream=True, stream_options={"include_usage": True},
        )
        text, finish_reason, usage = stream_text(stream)
        assert text == offline.outputs[0].text
        assert finish_reason == offline.outputs[0].finish_reason
        assert usage.total_tokens == response.usage.total_tokens


def test_batched_and_token_id_prompts(openai_client, offline_llm):
    expected = offline_llm.generate(PROMPTS[:2], greedy(), use_tqdm=False)
    response = openai_client.completions.create(
        model=SERVED_NAME, prompt=PROMPTS[:2], max_tokens=MAX_TOKENS, temperature=0, n=2
    )
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    texts = [c.text for c in response.choices]
    assert texts == [expected[0].outputs[0].text] * 2 + [expected[1].outputs[0].text] * 2
    by_ids = openai_client.completions.create(
        model=SERVED_NAME, prompt=expected[0].prompt_token_ids, max_tokens=MAX_TOKENS,
        temperature=0, echo=True,
    )
    assert by_ids.choices[0].text == PROMPTS[0] + expected[0].outputs[0].text


def test_n_and_seed(openai_client):
    def sample(seed: int | None, n: int = 2):
        return openai_client.chat.completions.create(
            model=SERVED_NAME, messages=CONVERSATIONS[0], max_tokens=MAX_TOKENS,
            temperature=1.0, n=n, seed=seed,
        )

    first, again, other = sample(1234), sample(1234), sample(999)
    assert len(first.choices) == 2 and [c.index for c in first.choices] == [0, 1]
    assert [c.message.content for c in first.choices] == [c.message.content for c in again.choices]
    assert [c.message.content for c in first.choices] != [c.message.content for c in other.choices]
    # The two samples of one request differ (their seeds do).
    assert first.choices[0].message.content != first.choices[1].message.content
    assert 2 <= first.usage.completion_tokens <= 2 * MAX_TOKENS
    streamed = openai_client.chat.completions.create(
        model=SERVED_NAME, messages=CONVERSATIONS[0], max_tokens=MAX_TOKENS, temperature=1.0,
        n=2, seed=1234, stream=True,
    )
    texts = ["", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in first.choices]


def test_stop_strings(openai_client):
    base = openai_client.completions.create(
        model=SERVED_NAME, prompt=PROMPTS[2], max_tokens=16, temperature=0
    ).choices[0].text
    stop = next(base[i:i + 2] for i in range(3, len(base) - 2) if base[i:i + 2].strip())
    expected = base[: base.index(stop)]
    for stream in (False, True):
        response = openai_client.completions.create(
            model=SERVED_NAME, prompt=PROMPTS[2], max_tokens=16, temperature=0, stop=[stop, "zzz"],
            stream=stream,
        )
        if stream:
            text, finish_reason, _ = stream_text(response)
        else:
            text, finish_reason = response.choices[0].text, response.choices[0].finish_reason
        assert text == expected
        assert finish_reason == "stop"


def test_logprobs(openai_client):
    response = openai_client.completions.create(
        model=SERVED_NAME, prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=3,
        extra_body={"ignore_eos": True},
    )
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == 6
    # OpenAI's legacy shape: the chosen token's logprob is always there, so up to logprobs + 1.
    for token, token_logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        assert 3 <= len(top) <= 4 and top[token] == token_logprob
        assert max(top.values()) >= token_logprob
    assert logprobs.text_offset[0] == 0
    chat = openai_client.chat.completions.create(
        model=SERVED_NAME, messages=CONVERSATIONS[0], max_tokens=6, temperature=0,
        logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True},
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        assert entry.logprob <= 0
        assert len(entry.top_logprobs) == 2
        # Greedy picks the most likely token.
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
    # The bytes of all tokens are the reply's UTF-8, even where a token splits a character.
    assert bytes(b for entry in content for b in entry.bytes).decode(
        "utf-8", errors="replace"
    ) == chat.choices[0].message.content


def test_api_key(tiny_server):
    url = f"{tiny_server.base_url}/v1/chat/completions"
    body = {"model": SERVED_NAME, "messages": CONVERSATIONS[0], "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY},
                    {"Authorization": f"Basic {API_KEY}"}):
        response = httpx.post(url, json=body, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{tiny_server.base_url}/v1/models").status_code == 401
    response = httpx.post(url, json=body, headers={"Authorization": f"Bearer {API_KEY}"})
    assert response.status_code == 200
    # Health and metrics stay open (probes and scrapers carry no key).
    assert httpx.get(f"{tiny_server.base_url}/health").status_code == 200
    assert httpx.get(f"{tiny_server.base_url}/metrics").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="nope",
                      max_retries=0).models.list()
