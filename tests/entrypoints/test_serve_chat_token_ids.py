"""vLLM's `return_token_ids` on /v1/chat/completions, through the official openai client against
the session's tiny server: the response's prompt_token_ids are the HF tokenizer's own rendering
of the chat template (apply_chat_template with the generation prompt), each choice's token_ids
are the offline LLM's greedy ids and decode to the returned text, a stream's ids add up to the
whole reply's (n > 1 seeded, logprobs, echo), usage counts the ids, and under a tool parser the
ids are the raw generated ones whatever the parser made of their text. A value that is not a
boolean is a 400 naming the field, and without the field no response carries the ids."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from ladle import SamplingParams
from tests.entrypoints.conftest import API_KEY, SERVED_NAME
from tests.entrypoints.sse_reader import read_chat_stream, reassemble
from tests.entrypoints.test_serve_stream_shape import TOOL_CHOICES, TOOLS, TRUNCATE

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
MAX_TOKENS = 10
RETURN_IDS = {"return_token_ids": True}


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path("llama"))


@pytest.fixture(scope="module")
def rendered_prompt_ids(hf_tokenizer) -> list[int]:
    return list(hf_tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    ))


def _stream_ids(stream) -> tuple[list[list[int]], dict[int, list[int]], dict[int, str], object]:
    """(every prompt_token_ids seen, each choice's ids, each choice's text, usage) of a stream
    read with the openai client."""
    prompt_ids, token_ids, texts, usage = [], {}, {}, None
    for chunk in stream:
        if getattr(chunk, "prompt_token_ids", None) is not None:
            prompt_ids.append(chunk.prompt_token_ids)
        usage = chunk.usage or usage
        for choice in chunk.choices:
            token_ids.setdefault(choice.index, []).extend(getattr(choice, "token_ids", None) or [])
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    return prompt_ids, token_ids, texts, usage


def test_greedy_ids_whole_and_streamed(openai_client, offline_llm, hf_tokenizer,
                                       rendered_prompt_ids):
    [offline] = offline_llm.chat(
        [MESSAGES], SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), use_tqdm=False
    )
    whole = openai_client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
        extra_body=RETURN_IDS,
    )
    [choice] = whole.choices
    assert whole.prompt_token_ids == rendered_prompt_ids == list(offline.prompt_token_ids)
    assert choice.token_ids == list(offline.outputs[0].token_ids)
    assert hf_tokenizer.decode(choice.token_ids, skip_special_tokens=True) == (
        choice.message.content
    )
    assert whole.usage.prompt_tokens == len(whole.prompt_token_ids)
    assert whole.usage.completion_tokens == len(choice.token_ids)

    stream = openai_client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=RETURN_IDS,
    )
    prompt_ids, token_ids, texts, usage = _stream_ids(stream)
    assert prompt_ids == [rendered_prompt_ids]  # once: on the one choice's opening chunk
    assert token_ids == {0: choice.token_ids}
    assert texts == {0: choice.message.content}
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        len(rendered_prompt_ids), len(choice.token_ids)
    )


@pytest.mark.parametrize("extra", [{}, {"logprobs": True, "top_logprobs": 2}],
                         ids=["plain", "logprobs"])
def test_seeded_choices_stream_the_ids_of_the_whole_reply(openai_client, hf_tokenizer,
                                                          rendered_prompt_ids, extra):
    kwargs = dict(model=SERVED_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=1.0,
                  n=3, seed=4321, extra_body=RETURN_IDS, **extra)
    whole = openai_client.chat.completions.create(**kwargs)
    assert whole.prompt_token_ids == rendered_prompt_ids
    by_index = {choice.index: choice for choice in whole.choices}
    for choice in whole.choices:
        assert hf_tokenizer.decode(choice.token_ids, skip_special_tokens=True) == (
            choice.message.content
        )
        if extra:
            assert len(choice.logprobs.content) == len(choice.token_ids)
    assert whole.usage.completion_tokens == sum(len(c.token_ids) for c in whole.choices)

    prompt_ids, token_ids, texts, _ = _stream_ids(
        openai_client.chat.completions.create(stream=True, **kwargs)
    )
    # As vLLM: the prompt's ids on each choice's opening chunk.
    assert prompt_ids == [rendered_prompt_ids] * 3
    assert token_ids == {index: by_index[index].token_ids for index in range(3)}
    assert texts == {index: by_index[index].message.content for index in range(3)}


def test_echo_keeps_the_ids_to_the_generated_ones(tiny_server):
    """echo puts the last (assistant) message's text before the reply's content; the ids stay
    the prompt's and the generated ones, as vLLM's do."""
    conversation = [*MESSAGES, {"role": "assistant", "content": "Hi there"}]
    body = {"model": SERVED_NAME, "messages": conversation, "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "add_generation_prompt": False, "continue_final_message": True,
            "return_token_ids": True}
    plain = _post(tiny_server, body)
    echoed = _post(tiny_server, {**body, "echo": True})
    assert echoed["prompt_token_ids"] == plain["prompt_token_ids"]
    assert echoed["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    assert len(plain["choices"][0]["token_ids"]) == 6
    assert echoed["choices"][0]["message"]["content"] == (
        "Hi there" + plain["choices"][0]["message"]["content"]
    )
    chunks = read_chat_stream(tiny_server.base_url, {**body, "echo": True}, HEADERS)
    assert [c["prompt_token_ids"] for c in chunks if "prompt_token_ids" in c] == [
        plain["prompt_token_ids"]
    ]
    assert reassemble(chunks)["token_ids"] == plain["choices"][0]["token_ids"]


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_under_a_tool_parser_the_ids_are_the_raw_generated_ones(tiny_server, hf_tokenizer,
                                                                tool_choice):
    """The parser turns the text into tool_calls (content empty); the ids still decode to the
    text the model wrote, and streamed (where the parser holds text back) add up the same."""
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "temperature": 0, "max_tokens": 60, "tools": TOOLS, "return_token_ids": True,
            **TOOL_CHOICES[tool_choice], **TRUNCATE}
    whole = _post(tiny_server, body)
    [choice] = whole["choices"]
    [call] = choice["message"]["tool_calls"]
    assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"]
    raw = hf_tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    if tool_choice == "auto":  # Hermes' format, written by the model
        written = json.loads(raw.split("<tool_call>")[1].split("</tool_call>")[0])
        assert written == {"name": call["function"]["name"],
                           "arguments": json.loads(call["function"]["arguments"])}
    else:  # the forced grammar's JSON list of calls
        assert json.loads(raw) == [{"name": call["function"]["name"],
                                    "parameters": json.loads(call["function"]["arguments"])}]
    assert whole["usage"]["completion_tokens"] == len(choice["token_ids"])
    chunks = read_chat_stream(tiny_server.base_url, body, HEADERS)
    assert reassemble(chunks)["token_ids"] == choice["token_ids"]


@pytest.mark.parametrize("value", ["yes", 1, None, [True]])
def test_a_value_that_is_not_a_boolean_is_a_400_naming_it(openai_client, value):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.chat.completions.create(
            model=SERVED_NAME, messages=MESSAGES, max_tokens=2,
            extra_body={"return_token_ids": value},
        )
    assert info.value.body["param"] == "return_token_ids", info.value.body
    # the server keeps serving
    assert openai_client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=2
    ).choices


@pytest.mark.parametrize("stream", [False, True])
def test_without_it_no_response_carries_ids(tiny_server, stream):
    body = {"model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 4, "temperature": 0,
            "return_token_ids": False}
    if stream:
        chunks = read_chat_stream(tiny_server.base_url, body, HEADERS)  # checks every chunk
        assert chunks and all("prompt_token_ids" not in chunk for chunk in chunks)
        return
    whole = _post(tiny_server, body)
    assert "prompt_token_ids" not in whole and "token_ids" not in whole["choices"][0]


def _post(tiny_server, body: dict) -> dict:
    response = httpx.post(f"{tiny_server.base_url}/v1/chat/completions", json=body,
                          headers=HEADERS, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()
