"""The model's own generation_config.json `max_new_tokens`, on a real `ladle serve`, read as
vLLM reads it (ModelConfig.get_diff_sampling_param makes it max_tokens; the OpenAI server's
get_max_tokens takes the least of it, the request's and the room left): the default of a chat
request without max_tokens, a ceiling on one that asks more, and no change to one that asks
fewer; completions keep OpenAI's default of 16 under it. The start-up log names it.
Offline and `--generation-config vllm`: tests/model/test_generation_defaults.py."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.entrypoints.conftest import API_KEY, TINY_ENGINE_ARGS
from tests.entrypoints.server_process import ServerProcess

SERVED = "tiny"
MAX_NEW_TOKENS = 4
HI = [{"role": "user", "content": "hi there"}]


@pytest.fixture(scope="module")
def server(tiny_model_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("model_max_new_tokens") / "model"
    shutil.copytree(tiny_model_path("llama"), folder)
    (folder / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "max_new_tokens": MAX_NEW_TOKENS})
    )
    args = [str(folder), "--served-model-name", SERVED, *TINY_ENGINE_ARGS]
    with ServerProcess(args, api_key=API_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client()


def test_start_up_log_names_it(server) -> None:
    log = server.log()
    assert f"the model's generation config: max_tokens={MAX_NEW_TOKENS}" in log, log
    assert f"generates at most max_tokens={MAX_NEW_TOKENS}" in log


@pytest.mark.parametrize(
    ("asked", "generated"),
    [(None, MAX_NEW_TOKENS), (50, MAX_NEW_TOKENS), (2, 2)],
)
def test_chat_max_tokens_is_defaulted_and_capped(client, asked, generated) -> None:
    reply = client.chat.completions.create(
        model=SERVED, messages=HI, max_tokens=asked, extra_body={"ignore_eos": True}
    )
    assert reply.usage.completion_tokens == generated
    assert reply.choices[0].finish_reason == "length"


def test_chat_max_completion_tokens_is_capped_too(client) -> None:
    reply = client.chat.completions.create(
        model=SERVED, messages=HI, max_completion_tokens=30, extra_body={"ignore_eos": True}
    )
    assert reply.usage.completion_tokens == MAX_NEW_TOKENS


def test_streamed_chat_stops_at_it(client) -> None:
    stream = client.chat.completions.create(
        model=SERVED, messages=HI, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == MAX_NEW_TOKENS
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_completions_default_of_16_is_capped(client) -> None:
    completion = client.completions.create(
        model=SERVED, prompt="hello", extra_body={"ignore_eos": True}
    )
    assert completion.usage.completion_tokens == MAX_NEW_TOKENS
    asked_fewer = client.completions.create(
        model=SERVED, prompt="hello", max_tokens=1, extra_body={"ignore_eos": True}
    )
    assert asked_fewer.usage.completion_tokens == 1
