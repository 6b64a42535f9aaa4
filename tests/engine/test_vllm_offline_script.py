"""A vLLM offline script runs unchanged with `from ladle import ...` (the import line is the only
difference), and the vLLM-only SamplingParams fields behave as in vLLM."""

from __future__ import annotations

import math
import textwrap

import pytest

from ladle import LLM, SamplingParams

VLLM_SCRIPT = textwrap.dedent(
    """
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = ["Hello, my name is", "The capital of France is"]
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95, seed=-1, max_tokens=8)
    llm = LLM(model=MODEL)
    outputs = llm.generate(prompts, sampling_params)
    texts = [(output.prompt, output.outputs[0].text) for output in outputs]

    tokenizer = llm.get_tokenizer()
    ids = tokenizer.encode("The capital of France is")
    greedy = SamplingParams(temperature=0, max_tokens=6, logprobs=2)
    by_ids = llm.generate(TokensPrompt(prompt_token_ids=ids), greedy)
    by_dict = llm.generate([{"prompt": "The capital of France is"}], greedy)
    conversation = [{"role": "user", "content": "Hi there"}]
    rendered = tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True
    )
    chat = llm.chat(conversation, greedy)
    """
)


def run_vllm_script(model: str) -> dict:
    source = VLLM_SCRIPT.replace("from vllm.inputs import", "from ladle import")
    source = source.replace("from vllm import", "from ladle import")
    namespace = {"MODEL": model}
    exec(compile(source, "vllm_example.py", "exec"), namespace)  # noqa: S102 - our own script
    return namespace


def test_vllm_script_runs_unchanged(tiny_model_path) -> None:
    result = run_vllm_script(tiny_model_path("llama"))
    assert [prompt for prompt, _ in result["texts"]] == [
        "Hello, my name is",
        "The capital of France is",
    ]
    assert all(isinstance(text, str) for _, text in result["texts"])
    by_ids, by_dict = result["by_ids"][0], result["by_dict"][0]
    # A TokensPrompt is read as ids, not as the text "prompt_token_ids".
    assert by_ids.prompt_token_ids == result["ids"]
    assert by_ids.outputs[0].token_ids == by_dict.outputs[0].token_ids
    completion = by_ids.outputs[0]
    assert len(completion.logprobs) == len(completion.token_ids)
    assert math.isclose(
        completion.cumulative_logprob,
        sum(p[t].logprob for t, p in zip(completion.token_ids, completion.logprobs)),
        rel_tol=1e-6,
    )
    # get_tokenizer() is the Hugging Face tokenizer: tokenize=False renders text.
    assert isinstance(result["rendered"], str) and "Hi there" in result["rendered"]
    assert result["chat"][0].prompt_token_ids == result["tokenizer"].encode(
        result["rendered"], add_special_tokens=False
    )


@pytest.fixture(scope="module")
def llm(tiny_model_path):
    return LLM(tiny_model_path("llama"), num_kv_blocks=64)


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm) -> None:
    ids = list(range(5, 25))
    greedy = dict(temperature=0.0, max_tokens=4)
    truncated = llm.generate(
        [ids], SamplingParams(truncate_prompt_tokens=6, **greedy), use_tqdm=False
    )[0]
    reference = llm.generate([ids[-6:]], SamplingParams(**greedy), use_tqdm=False)[0]
    assert truncated.prompt_token_ids == ids[-6:]
    assert truncated.outputs[0].token_ids == reference.outputs[0].token_ids


def test_detokenize_false_gives_ids_only(llm) -> None:
    output = llm.generate(
        ["hello"], SamplingParams(max_tokens=4, detokenize=False, temperature=0), use_tqdm=False
    )[0]
    assert output.outputs[0].text == ""
    assert len(output.outputs[0].token_ids) == 4


def test_seed_minus_one_is_random_and_unknown_fields_are_named() -> None:
    assert SamplingParams(seed=-1).seed is None
    for name, value in [
        ("logits_processors", [print]),
        ("guided_decoding", {"json": {}}),
    ]:
        with pytest.raises(ValueError, match=name):
            SamplingParams(**{name: value})
    with pytest.raises(ValueError, match="truncate_prompt_tokens"):
        SamplingParams(truncate_prompt_tokens=0)
    with pytest.raises(TypeError, match="not_a_field"):
        SamplingParams(not_a_field=1)


def test_bad_prompt_dict_is_named(llm) -> None:
    outputs = llm.generate(
        [{"prompt": "hi", "multi_modal_data": {}}],
        SamplingParams(max_tokens=2),
        use_tqdm=False,
        raise_on_error=False,
    )
    assert "multi_modal_data" in outputs[0].error


def test_chat_takes_a_chat_template_inline_or_from_a_file(llm, tmp_path) -> None:
    """vLLM's LLM.chat(chat_template=...): the given template renders the prompt, not the
    tokenizer's own; a file path works as well as inline Jinja; a bad value is named."""
    template = "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}\n{% endfor %}"
    conversation = [{"role": "user", "content": "Hi there"}]
    greedy = SamplingParams(temperature=0.0, max_tokens=2)
    expected = llm.get_tokenizer().encode("<<user>>Hi there\n", add_special_tokens=False)
    inline = llm.chat(conversation, greedy, use_tqdm=False, chat_template=template)[0]
    assert inline.prompt_token_ids == expected
    path = tmp_path / "template.jinja"
    path.write_text(template)
    from_file = llm.chat(conversation, greedy, use_tqdm=False, chat_template=str(path))[0]
    assert from_file.prompt_token_ids == expected
    with pytest.raises(ValueError, match="neither a file nor a Jinja template"):
        llm.chat(conversation, greedy, chat_template="no-such-file.jinja")
