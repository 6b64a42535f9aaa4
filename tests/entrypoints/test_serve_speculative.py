"""`ladle serve --speculative-config` with the official openai client: streamed completions
and chat equal the offline engine's without speculation, chunks may carry several tokens, usage
counts stay exact, and /metrics shows the spec-decode counters."""

from __future__ import annotations

import json

import pytest

from ladle import SamplingParams
from tests.entrypoints.conftest import API_KEY, SERVED_NAME, TINY_ENGINE_ARGS
from tests.entrypoints.server_process import ServerProcess, read_metrics

SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 4, "adaptive": False}
# Repetitive prompts: prompt lookup finds its matches, random weights loop.
PROMPTS = ["one two three one two three one two", "the cat the cat the cat the",
           "abc abc abc abc abc", "Hello, world! Hello, world! Hello,"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def speculative_server(tiny_model_path):
    server = ServerProcess(
        [tiny_model_path("llama"), "--served-model-name", SERVED_NAME, *TINY_ENGINE_ARGS,
         "--speculative-config", json.dumps(SPECULATIVE)],
        api_key=API_KEY,
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def client(speculative_server):
    return speculative_server.openai_client()


def test_streamed_completions_equal_offline_without_speculation(
    client, offline_llm, speculative_server
):
    expected = offline_llm.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True),
        use_tqdm=False,
    )
    tokens_per_chunk = []
    for prompt, offline in zip(PROMPTS, expected, strict=True):
        stream = client.completions.create(
            model=SERVED_NAME, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
            logprobs=0, stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        text, usage, num_tokens = "", None, 0
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.text or ""
                if choice.logprobs is not None and choice.logprobs.tokens:
                    tokens_per_chunk.append(len(choice.logprobs.tokens))
                    num_tokens += len(choice.logprobs.tokens)
        assert text == offline.outputs[0].text
        assert num_tokens == len(offline.outputs[0].token_ids) == MAX_TOKENS
        assert usage.completion_tokens == MAX_TOKENS
        assert usage.prompt_tokens == len(offline.prompt_token_ids)
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert max(tokens_per_chunk) > 1  # some chunks carried accepted drafts
    metrics = read_metrics(speculative_server)
    assert metrics["vllm:spec_decode_num_accepted_tokens_total"] > 0
    assert (metrics["vllm:spec_decode_num_draft_tokens_total"]
            >= metrics["vllm:spec_decode_num_accepted_tokens_total"])


def test_streamed_chat_equals_offline_without_speculation(client, offline_llm):
    conversation = [{"role": "user", "content": PROMPTS[1]}]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    expected = offline_llm.chat([conversation], params, use_tqdm=False)[0]
    stream = client.chat.completions.create(
        model=SERVED_NAME, messages=conversation, max_completion_tokens=MAX_TOKENS,
        temperature=0, stream=True, stream_options={"include_usage": True},
    )
    text, finish_reason, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish_reason = choice.finish_reason or finish_reason
    assert text == expected.outputs[0].text
    assert finish_reason == expected.outputs[0].finish_reason
    assert usage.completion_tokens == len(expected.outputs[0].token_ids)
