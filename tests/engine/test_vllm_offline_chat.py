"""vLLM's offline surface beyond generate(): LLM.chat's arguments (continue_final_message,
tools, content parts, chat_template_content_format, lora_request), CompletionOutput.finished(),
SamplingParams.clone(), `ladle.sampling_params`, and size strings for LLM(max_model_len=...).
References are the Hugging Face tokenizer's own renderings of the same conversations."""

from __future__ import annotations

import pytest

from ladle import LLM, SamplingParams
from ladle.entrypoints.llm import RequestErrors

GREEDY = SamplingParams(temperature=0.0, max_tokens=3)
CONVERSATION = [
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello, I am"},
]


@pytest.fixture(scope="module")
def llm(tiny_model_path):
    return LLM(tiny_model_path("llama"), num_kv_blocks=64, max_model_len="256")


def hf_ids(llm, conversation, **kwargs) -> list[int]:
    tokenizer = llm.get_tokenizer()
    text = tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


def test_continue_final_message_extends_the_assistant_turn(llm) -> None:
    [output] = llm.chat(
        CONVERSATION, GREEDY, use_tqdm=False,
        add_generation_prompt=False, continue_final_message=True,
    )
    expected = hf_ids(llm, CONVERSATION, continue_final_message=True)
    assert output.prompt_token_ids == expected
    # The open turn is not closed: the prompt ends with the assistant's words.
    closed = hf_ids(llm, CONVERSATION, add_generation_prompt=False)
    assert output.prompt_token_ids != closed
    assert llm.get_tokenizer().decode(output.prompt_token_ids).endswith("Hello, I am")
    with pytest.raises(ValueError, match="continue_final_message and add_generation_prompt"):
        llm.chat(CONVERSATION, GREEDY, continue_final_message=True)


def test_text_content_parts_render_as_the_string(llm) -> None:
    parts = [{"role": "user", "content": [
        {"type": "text", "text": "Hi "}, {"type": "text", "text": "there"},
    ]}]
    plain = [{"role": "user", "content": "Hi there"}]
    for content_format in ("auto", "string", "openai"):
        [output] = llm.chat(
            parts, GREEDY, use_tqdm=False, chat_template_content_format=content_format
        )
        assert output.prompt_token_ids == hf_ids(llm, plain, add_generation_prompt=True)
    with pytest.raises(ValueError, match="chat_template_content_format"):
        llm.chat(plain, GREEDY, chat_template_content_format="markdown")
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(RequestErrors, match=r"messages\[0\]\.content\[0\].*image_url"):
        llm.chat(image, GREEDY, use_tqdm=False)


def test_tools_reach_the_template(llm) -> None:
    template = (
        "{% for t in tools or [] %}[{{ t['function']['name'] }}]{% endfor %}"
        "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    plain = [{"role": "user", "content": "Hi"}]
    [output] = llm.chat(plain, GREEDY, use_tqdm=False, chat_template=template, tools=tools)
    expected = llm.get_tokenizer().encode("[get_weather]Hi", add_special_tokens=False)
    assert output.prompt_token_ids == expected


def test_lora_request_none_is_accepted_and_an_adapter_named(llm) -> None:
    plain = [{"role": "user", "content": "Hi"}]
    assert llm.generate("Hi", GREEDY, use_tqdm=False, lora_request=None)[0].outputs[0].token_ids
    assert llm.chat(plain, GREEDY, use_tqdm=False, lora_request=None)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="lora_request"):
        llm.generate("Hi", GREEDY, lora_request=object())


def test_completion_output_finished_is_a_method_and_max_model_len_takes_sizes(llm) -> None:
    output = llm.generate("Hi", GREEDY, use_tqdm=False)[0]
    assert output.finished is True  # RequestOutput: a field, as in vLLM
    assert output.outputs[0].finished() is True  # CompletionOutput: a method, as in vLLM
    assert llm.engine.max_model_len == 256  # LLM(max_model_len="256")


def test_sampling_params_clone_module_path_and_spacing_flag() -> None:
    from ladle.sampling_params import SamplingParams as ModuleSamplingParams
    from ladle.sampling_params import StructuredOutputsParams

    assert ModuleSamplingParams is SamplingParams
    original = SamplingParams(stop=["a"], structured_outputs=StructuredOutputsParams(choice=["x"]))
    copy = original.clone()
    copy.stop.append("b")
    assert original.stop == ["a"] and copy.stop == ["a", "b"]
    assert copy.structured_outputs == original.structured_outputs
    # Without special tokens in the text there is nothing to space: accepted.
    assert SamplingParams(spaces_between_special_tokens=False).skip_special_tokens
    with pytest.raises(ValueError, match="spaces_between_special_tokens"):
        SamplingParams(spaces_between_special_tokens=False, skip_special_tokens=False)


def test_size_strings_for_integer_options() -> None:
    from ladle.config import EngineConfig

    config = EngineConfig.from_kwargs(model="llama-tiny", load_format="dummy", max_model_len="4k")
    assert config.model.max_model_len == 4000
    assert EngineConfig.from_kwargs(
        model="llama-tiny", load_format="dummy", max_model_len="2K"
    ).model.max_model_len == 2048
    with pytest.raises(ValueError, match="max_model_len"):
        EngineConfig.from_kwargs(model="llama-tiny", load_format="dummy", max_model_len="four")
