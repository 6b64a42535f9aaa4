"""`ladle serve --skip-tokenizer-init` on a model folder with no tokenizer files, through the
official openai client: token-id prompts give the offline reference's greedy ids (vLLM's
return_token_ids puts them on each choice, streamed and not) with empty text; what needs a
tokenizer is a 400 naming the option, and the server keeps serving."""

from __future__ import annotations

import openai
import pytest

from ladle import SamplingParams
from tests.entrypoints.conftest import TINY_ENGINE_ARGS
from tests.entrypoints.server_process import ServerProcess
from tests.entrypoints.test_skip_tokenizer_init import copy_without_tokenizer

MAX_TOKENS = 8
PROMPT_IDS = [[5, 17, 42, 99, 123], [7, 8, 9]]
IGNORE_EOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def skip_server(tiny_model_path, tmp_path_factory):
    folder = copy_without_tokenizer(
        tiny_model_path("llama"), tmp_path_factory.mktemp("serve_skiptok") / "llama"
    )
    server = ServerProcess([folder, "--skip-tokenizer-init", *TINY_ENGINE_ARGS])
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(skip_server):
    return skip_server.openai_client()


@pytest.fixture(scope="module")
def expected_ids(offline_llm) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = offline_llm.generate(PROMPT_IDS, params, use_tqdm=False)
    return [output.outputs[0].token_ids for output in outputs]


def test_token_ids_in_and_out_whole(client, expected_ids):
    response = client.completions.create(
        model=None, prompt=PROMPT_IDS, max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"return_token_ids": True, **IGNORE_EOS},
    )
    assert len(response.choices) == len(PROMPT_IDS)
    for choice in response.choices:
        assert choice.text == ""
        assert choice.prompt_token_ids == PROMPT_IDS[choice.index]
        assert choice.token_ids == expected_ids[choice.index]
    assert response.usage.completion_tokens == MAX_TOKENS * len(PROMPT_IDS)


def test_token_ids_in_and_out_streamed(client, expected_ids):
    stream = client.completions.create(
        model=None, prompt=PROMPT_IDS[0], max_tokens=MAX_TOKENS, temperature=0, stream=True,
        extra_body={"return_token_ids": True, **IGNORE_EOS},
    )
    token_ids: list[int] = []
    prompt_ids = []
    text = ""
    finish_reason = None
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.text
            token_ids += choice.token_ids or []
            if getattr(choice, "prompt_token_ids", None) is not None:
                prompt_ids.append(choice.prompt_token_ids)
            finish_reason = choice.finish_reason or finish_reason
    assert text == ""
    assert token_ids == expected_ids[0]
    assert prompt_ids == [PROMPT_IDS[0]]  # once, with the choice's first chunk
    assert finish_reason == "length"


def test_without_return_token_ids_the_choice_has_no_id_fields(client):
    response = client.completions.create(
        model=None, prompt=PROMPT_IDS[1], max_tokens=2, temperature=0, extra_body=IGNORE_EOS
    )
    assert response.choices[0].text == ""
    assert "token_ids" not in response.choices[0].model_dump(exclude_unset=True)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c: c.completions.create(model=None, prompt="Hello", max_tokens=2), "prompt"),
        (lambda c: c.completions.create(model=None, prompt=[5, 6], max_tokens=2, stop=["x"]),
         "stop"),
        (lambda c: c.chat.completions.create(
            model=None, messages=[{"role": "user", "content": "hi"}], max_tokens=2), None),
        (lambda c: c.completions.create(
            model=None, prompt=[5, 6], max_tokens=2, extra_body={"bad_words": ["hi"]}),
         "bad_words"),
        (lambda c: c.completions.create(
            model=None, prompt=[5, 6], max_tokens=2,
            extra_body={"structured_outputs": {"choice": ["a", "b"]}}), "structured_outputs"),
        # vLLM's token counting routes, at the server's root.
        (lambda c: c.post("/../tokenize", cast_to=object, body={"prompt": "hi"}), None),
        (lambda c: c.post("/../detokenize", cast_to=object, body={"tokens": [5]}), None),
    ],
)
def test_what_needs_a_tokenizer_is_a_400_and_serving_goes_on(client, expected_ids, call, field):
    with pytest.raises(openai.BadRequestError) as caught:
        call(client)
    error = caught.value.body
    assert "skip_tokenizer_init" in error["message"]
    if field is not None:
        assert error["param"] == field
    response = client.completions.create(
        model=None, prompt=PROMPT_IDS[1], max_tokens=MAX_TOKENS, temperature=0,
        extra_body={"return_token_ids": True, **IGNORE_EOS},
    )
    assert response.choices[0].token_ids == expected_ids[1]
