"""vLLM's POST /tokenize and /detokenize on the session's tiny server: the ids are the HF
tokenizer's own (a chat's are exactly the prompt /v1/chat/completions runs, as its
return_token_ids shows), the response has vLLM's fields, and bad bodies are 400s naming the
field while the server keeps serving."""

from __future__ import annotations

import httpx
import pytest

from tests.entrypoints.conftest import SERVED_NAME

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path("llama"))


def _post(server, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{route}", json=body, headers=server.headers(), timeout=30)


def test_tokenize_a_prompt_as_the_hf_tokenizer_does(tiny_server, hf_tokenizer):
    text = "The quick brown fox"
    for add_special_tokens in (True, False):
        reply = _post(tiny_server, "/tokenize", {
            "model": SERVED_NAME, "prompt": text, "add_special_tokens": add_special_tokens,
            "return_token_strs": True,
        })
        assert reply.status_code == 200, reply.text
        body = reply.json()
        expected = hf_tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        assert body["tokens"] == expected
        assert body["count"] == len(expected)
        assert body["token_strs"] == hf_tokenizer.convert_ids_to_tokens(expected)
        models = httpx.get(f"{tiny_server.base_url}/v1/models", headers=tiny_server.headers())
        assert body["max_model_len"] == models.json()["data"][0]["max_model_len"]
    assert _post(tiny_server, "/tokenize", {"prompt": text}).json()["token_strs"] is None


def test_tokenize_a_chat_gives_the_prompt_chat_completions_runs(
    tiny_server, openai_client, hf_tokenizer
):
    body = _post(tiny_server, "/tokenize", {"messages": MESSAGES}).json()
    expected = list(hf_tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    ))
    assert body["tokens"] == expected and body["count"] == len(expected)
    completion = openai_client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=1,
        extra_body={"return_token_ids": True},
    )
    assert completion.prompt_token_ids == body["tokens"]
    assert completion.usage.prompt_tokens == body["count"]
    without_prompt = _post(
        tiny_server, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": False}
    ).json()
    assert without_prompt["tokens"] == list(hf_tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=False, tokenize=True, return_dict=False
    ))


def test_detokenize_round_trips(tiny_server, hf_tokenizer):
    text = "Hello world, again"
    ids = _post(tiny_server, "/tokenize", {"prompt": text}).json()["tokens"]
    reply = _post(tiny_server, "/detokenize", {"model": SERVED_NAME, "tokens": ids})
    assert reply.status_code == 200
    assert reply.json() == {"prompt": hf_tokenizer.decode(ids)}
    assert reply.json()["prompt"] == text


@pytest.mark.parametrize(
    ("route", "body", "status", "param"),
    [
        ("/tokenize", {"prompt": 5}, 400, "prompt"),
        ("/tokenize", {}, 400, "prompt"),
        ("/tokenize", {"prompt": "x", "add_special_tokenz": True}, 400, "add_special_tokenz"),
        ("/tokenize", {"prompt": "x", "model": "other"}, 404, "model"),
        ("/tokenize", {"messages": []}, 400, "messages"),
        ("/tokenize", {"messages": [{"role": "user", "content": "x"}],
                       "chat_template_kwargs": {"tokenize": True}}, 400, "chat_template_kwargs"),
        ("/detokenize", {"tokens": [5, 10**6]}, 400, "tokens.1"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens.0"),
        ("/detokenize", {"tokens": ["a"]}, 400, "tokens.0"),
        ("/detokenize", {"tokens": [5], "model": "other"}, 404, "model"),
    ],
)
def test_bad_bodies_name_the_field(tiny_server, route, body, status, param):
    reply = _post(tiny_server, route, body)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["param"] == param
    assert _post(tiny_server, "/tokenize", {"prompt": "still here"}).status_code == 200


def test_the_api_key_guards_them(tiny_server):
    reply = httpx.post(f"{tiny_server.base_url}/tokenize", json={"prompt": "x"}, timeout=30)
    assert reply.status_code == 401
