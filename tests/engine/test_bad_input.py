"""Bad input gets a ValueError that names the problem and never costs another request its result."""

from __future__ import annotations

import pytest
from helpers.tiny_models import save_tiny_model

from ladle import LLM, SamplingParams
from ladle.entrypoints.llm import RequestErrors


@pytest.fixture(scope="module")
def llm(tiny_model_path):
    return LLM(tiny_model_path("llama"), block_size=4, max_model_len=128, num_kv_blocks=400)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_tokens", 0, "max_tokens"),
        ("max_tokens", -3, "max_tokens"),
        ("temperature", -1.0, "temperature"),
        ("top_p", 0.0, "top_p"),
        ("top_p", 1.5, "top_p"),
        ("top_k", -2, "top_k"),
        ("n", 0, "n must"),
        ("min_p", 2.0, "min_p"),
        ("logprobs", -1, "logprobs"),
    ],
)
def test_bad_sampling_params_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def test_bad_prompts_fail_alone(llm):
    good = "the cat sat on the mat"
    too_long = list(range(3, 3 + 200))  # 200 tokens > max_model_len 128
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    with pytest.raises(RequestErrors) as caught:
        llm.generate([good, "", too_long, good, [5, "x"]], params, use_tqdm=False)
    error = caught.value
    assert isinstance(error, ValueError)
    message = str(error)
    assert "request 1" in message and "empty" in message
    assert "request 2" in message and "max_model_len=128" in message
    assert "request 4" in message and "integers" in message
    outputs = error.outputs
    assert [o.outputs[0].finish_reason for o in outputs] == [
        "length",
        "error",
        "error",
        "length",
        "error",
    ]
    assert len(outputs[0].outputs[0].token_ids) == 5
    assert outputs[0].outputs[0].token_ids == outputs[3].outputs[0].token_ids
    stats = llm.engine.get_stats()
    assert stats.num_free_blocks == stats.num_total_blocks


def test_prompt_plus_max_tokens_over_model_length(llm):
    outputs = llm.generate(
        [list(range(3, 103))], SamplingParams(max_tokens=100), use_tqdm=False, raise_on_error=False
    )
    assert outputs[0].outputs[0].finish_reason == "error"
    assert "max_model_len=128" in outputs[0].error


def test_request_larger_than_the_whole_pool(tiny_model_path):
    small = LLM(tiny_model_path("llama"), block_size=4, num_kv_blocks=5)  # 16 token slots
    with pytest.raises(ValueError, match=r"max_model_len=16 \(the KV cache pool holds 16 tokens\)"):
        small.generate([list(range(3, 13))], SamplingParams(max_tokens=10), use_tqdm=False)


def test_token_id_outside_vocab(llm):
    vocab_size = llm.engine.vocab_size
    with pytest.raises(ValueError, match="outside the (tokenizer's )?vocabulary") as caught:
        llm.generate([[1, vocab_size + 5], [5, 6, 7]], SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(caught.value.outputs[1].outputs[0].token_ids) == 2


def test_missing_model_path(tmp_path):
    with pytest.raises(ValueError, match="does-not-exist"):
        LLM(str(tmp_path / "does-not-exist"))


def test_unknown_engine_option(tiny_model_path):
    with pytest.raises(ValueError, match="unknown engine option 'bogus'"):
        LLM(tiny_model_path("llama"), bogus=1)


def test_prompt_over_the_budget_without_chunked_prefill(tiny_model_path):
    llm = LLM(
        tiny_model_path("llama"), num_kv_blocks=64, max_num_batched_tokens=8,
        enable_chunked_prefill=False,
    )
    outputs = llm.generate(
        [list(range(3, 23)), [5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True),
        use_tqdm=False, raise_on_error=False,
    )
    assert "chunked prefill is off" in outputs[0].error
    assert len(outputs[1].outputs[0].token_ids) == 3


def test_pool_smaller_than_the_model_caps_the_length(tiny_model_path):
    small = LLM(tiny_model_path("llama"), block_size=4, num_kv_blocks=5)  # 16 token slots
    assert small.engine.max_model_len == 16
    completion = small.generate(
        [[5, 6, 7]], SamplingParams(max_tokens=None, ignore_eos=True), use_tqdm=False
    )[0].outputs[0]
    assert len(completion.token_ids) == 13 and completion.finish_reason == "length"


def test_padded_vocab_ids_never_break_a_request(tmp_path):
    """A model whose embedding is padded past its tokenizer (like Qwen) may sample an id the
    tokenizer lacks: it decodes to no text, and the request completes."""
    path = save_tiny_model(tmp_path, "llama", vocab_size=640)
    llm = LLM(path, num_kv_blocks=256)
    tokenizer_size = len(llm.get_tokenizer())
    params = SamplingParams(temperature=1.0, max_tokens=40, seed=1, ignore_eos=True)
    outputs = llm.generate(["Hello", "world"] * 4, params, use_tqdm=False)
    token_ids = [t for o in outputs for t in o.outputs[0].token_ids]
    assert any(t >= tokenizer_size for t in token_ids)  # the padding ids were really sampled
    assert all(len(o.outputs[0].token_ids) == 40 for o in outputs)
    for output in outputs:
        known = [t for t in output.outputs[0].token_ids if t < tokenizer_size]
        assert output.outputs[0].text == llm.tokenizer.decode(known)
