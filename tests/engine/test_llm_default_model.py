"""The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF) answers a real question."""

from __future__ import annotations

import pytest

from ladle import LLM, SamplingParams


@pytest.fixture(scope="module")
def default_llm():
    return LLM()


def test_chat_answers_paris_and_stops_at_end_of_turn(default_llm):
    outputs = default_llm.chat(
        [[{"role": "user", "content": "What is the capital of France?"}]],
        SamplingParams(temperature=0.0, max_tokens=64),
        use_tqdm=False,
    )
    completion = outputs[0].outputs[0]
    assert "Paris" in completion.text
    assert completion.finish_reason == "stop"
    # The end of turn is <|im_end|> (id 2), not the <|im_start|> the GGUF tokenizer calls EOS.
    assert completion.token_ids[-1] == 2
    assert "<|im_end|>" not in completion.text
    metrics = outputs[0].metrics
    assert 0 <= metrics.queue_time <= metrics.time_to_first_token <= metrics.e2e_latency


@pytest.mark.slow  # ~20 s of default-model decoding
def test_generate_text_prompt_streams_consistent_text(default_llm):
    tokenizer = default_llm.tokenizer
    outputs = default_llm.generate(
        ["The capital of France is"], SamplingParams(temperature=0.0, max_tokens=16),
        use_tqdm=False,
    )
    completion = outputs[0].outputs[0]
    assert completion.text == tokenizer.decode(completion.token_ids)
