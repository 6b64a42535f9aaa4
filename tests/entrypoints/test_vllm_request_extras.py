"""vLLM's request extras that ladle implements: each one changes what the server (or the
offline API) does, checked against a reference: the tokenizer itself, the sampler without the
extra, or the prefix cache's own counters.

The server here runs a tiny model whose tokenizer adds a bos token (so add_special_tokens has
an effect), with a chat template given by --chat-template, --max-logprobs 5 and
--disable-log-stats.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest
import torch

from ladle.core.block_hash import extend_block_hashes
from ladle.core.request import Request
from ladle.entrypoints.chat_template import load_chat_template
from ladle.entrypoints.openai.errors import BadRequestError
from ladle.entrypoints.openai.field_policy import REFUSED
from ladle.entrypoints.openai.prompt_options import truncate_prompt
from ladle.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from ladle.sample.bad_words import bad_words_token_ids, banned_by_bad_words
from ladle.sample.logit_processing import apply_logit_edits_, build_logit_edits
from ladle.sampling.params import SamplingParams
from tests.entrypoints.conftest import API_KEY, TINY_ENGINE_ARGS, TINY_ENGINE_OPTIONS
from tests.entrypoints.server_process import ServerProcess
from tests.entrypoints.test_field_policy import effective_value

SERVED = "tiny-bos"
# Every message closed by <|im_end|>, so continue_final_message has something to leave out.
TEMPLATE = (
    "{% if greeting is defined %}{{ greeting }}\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LONG_PROMPT = " ".join(["the quick brown fox jumps over the lazy dog"] * 8)


# ----- units -----------------------------------------------------------------------------------


def test_truncate_prompt_keeps_the_last_tokens() -> None:
    ids = list(range(10))
    assert truncate_prompt(ids, 3, 100) == [7, 8, 9]
    assert truncate_prompt(ids, None, 100) == ids
    assert truncate_prompt(ids, 20, 100) == ids
    assert truncate_prompt(ids, -1, 4) == [6, 7, 8, 9]  # -1: max_model_len
    for bad, message in ((0, ">= 1 or -1"), (-2, ">= 1 or -1"), (101, "larger than")):
        with pytest.raises(BadRequestError, match=message) as info:
            truncate_prompt(ids, bad, 100)
        assert info.value.param == "truncate_prompt_tokens"


def test_bad_words_ban_the_last_token_after_the_rest_was_generated() -> None:
    sequences = [[5], [7, 8], [1, 2, 3]]
    assert banned_by_bad_words(sequences, []) == [5]
    assert banned_by_bad_words(sequences, [9, 7]) == [5, 8]
    assert banned_by_bad_words(sequences, [7, 9]) == [5]
    assert banned_by_bad_words(sequences, [1, 2]) == [5, 3]
    params = [
        SamplingParams(bad_words_token_ids=[[4], [2, 6]]),
        SamplingParams(),
        SamplingParams(bad_words_token_ids=[[3, 1]]),
    ]
    edits = build_logit_edits(params, 8, [[2], [2], [3]])
    logits = torch.zeros(3, 8)
    apply_logit_edits_(logits, edits)
    expected = torch.zeros(3, 8)
    expected[0, 4] = expected[0, 6] = expected[2, 1] = float("-inf")
    assert torch.equal(logits, expected)


def test_bad_words_token_ids_come_from_the_tokenizer(tiny_tokenizer) -> None:
    sequences = bad_words_token_ids(["fox", " lazy dog"], tiny_tokenizer)
    encode = lambda text: tiny_tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    assert encode("fox") in sequences and encode("lazy dog") in sequences
    # mid-sentence spellings too, when they tokenize differently
    for word in ("fox", "lazy dog"):
        spaced = encode(" " + word)
        if len(spaced) == len(encode(word)) and spaced[0] != encode(word)[0]:
            assert spaced in sequences
    with pytest.raises(ValueError, match="bad_words"):
        SamplingParams(bad_words=[""])
    with pytest.raises(ValueError, match="bad_words"):
        SamplingParams(bad_words="fox")


def test_cache_salt_separates_block_hashes() -> None:
    def hashes(salt):
        request = Request("r", list(range(40)), SamplingParams(), cache_salt=salt)
        extend_block_hashes(request, 16)
        return request.block_hashes

    assert hashes("a") == hashes("a")
    assert not set(hashes("a")) & set(hashes("b"))
    assert not set(hashes(None)) & set(hashes("a"))
    with pytest.raises(ValueError, match="cache_salt"):
        SamplingParams(cache_salt="")


def test_chat_template_option_reads_inline_and_files(tmp_path: Path) -> None:
    assert load_chat_template(TEMPLATE) == TEMPLATE
    file = tmp_path / "template.jinja"
    file.write_text(TEMPLATE)
    assert load_chat_template(str(file)) == TEMPLATE
    with pytest.raises(ValueError, match="neither a file nor"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(ValueError, match="not a valid Jinja"):
        load_chat_template("{% for m in messages %}")


# ----- offline: the engine honours them --------------------------------------------------------


@pytest.fixture(scope="module")
def llm(tiny_model_path):
    from ladle import LLM

    return LLM(tiny_model_path("llama"), **TINY_ENGINE_OPTIONS, max_logprobs=3)


def test_offline_bad_words_never_generated(llm) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = llm.generate(LONG_PROMPT, greedy, use_tqdm=False)[0].outputs[0]
    banned_text = llm.get_tokenizer().decode(plain.token_ids[:1])
    assert banned_text.strip(), "the first token must have visible text to ban"
    params = SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, bad_words=[banned_text]
    )
    output = llm.generate(LONG_PROMPT, params, use_tqdm=False)[0].outputs[0]
    sequences = bad_words_token_ids([banned_text], llm.tokenizer)
    assert output.token_ids[0] != plain.token_ids[0]
    for sequence in sequences:  # no banned sequence appears anywhere in the output
        n = len(sequence)
        windows = [output.token_ids[i : i + n] for i in range(len(output.token_ids) - n + 1)]
        assert sequence not in windows


def test_offline_cache_salt_keeps_prefix_cache_apart(llm) -> None:
    params = SamplingParams(temperature=0, max_tokens=1)
    prompt = LONG_PROMPT + " once more"
    first = llm.generate(prompt, SamplingParams(**{**params.__dict__, "cache_salt": "alice"}),
                         use_tqdm=False)[0]
    again = llm.generate(prompt, SamplingParams(**{**params.__dict__, "cache_salt": "alice"}),
                         use_tqdm=False)[0]
    other = llm.generate(prompt, SamplingParams(**{**params.__dict__, "cache_salt": "bob"}),
                         use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    assert again.num_cached_tokens >= 16  # whole blocks of the same salt hit
    assert other.num_cached_tokens == 0  # another salt never does
    assert again.outputs[0].token_ids == other.outputs[0].token_ids
    # vLLM's spelling: the salt in the prompt dict
    salted = {"prompt": prompt, "cache_salt": "bob"}
    assert llm.generate(salted, params, use_tqdm=False)[0].num_cached_tokens >= 16
    fresh = {"prompt": prompt, "cache_salt": "carol"}
    assert llm.generate([fresh], None, use_tqdm=False)[0].num_cached_tokens == 0


def test_offline_max_logprobs(llm) -> None:
    ok = llm.generate("hi", SamplingParams(max_tokens=2, logprobs=3), use_tqdm=False)[0]
    assert all(len(entry) >= 3 for entry in ok.outputs[0].logprobs)
    with pytest.raises(ValueError, match="at most 3"):
        llm.generate("hi", SamplingParams(max_tokens=2, logprobs=4), use_tqdm=False)


# ----- server ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bos_model(tiny_model_path, tmp_path_factory) -> str:
    """The tiny llama, with a tokenizer that starts every encoding with its bos token."""
    from tokenizers import Tokenizer, processors

    folder = tmp_path_factory.mktemp("tiny_bos") / "llama"
    shutil.copytree(tiny_model_path("llama"), folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    bos = "<|begin_of_text|>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    return str(folder)


@pytest.fixture(scope="module")
def server(bos_model):
    server = ServerProcess(
        [bos_model, "--served-model-name", SERVED, *TINY_ENGINE_ARGS, "--chat-template",
         TEMPLATE, "--max-logprobs", "5", "--disable-log-stats", "--stats-interval", "0.2"],
        api_key=API_KEY,
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.base_url, headers=server.headers(), timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def reference_tokenizer(bos_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bos_model)
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def post(client, path: str, **body) -> dict:
    body.setdefault("model", SERVED)
    body.setdefault("max_tokens", 3)
    response = client.post(path, content=json.dumps(body))
    assert response.status_code == 200, response.text
    return response.json()


def chat_prompt_tokens(reference_tokenizer, messages, add_special_tokens=False, **kwargs) -> int:
    text = reference_tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return len(reference_tokenizer.encode(text, add_special_tokens=add_special_tokens))


def test_server_add_special_tokens(client, reference_tokenizer) -> None:
    prompt = "the lazy dog"
    with_bos = len(reference_tokenizer.encode(prompt))
    assert with_bos == len(reference_tokenizer.encode(prompt, add_special_tokens=False)) + 1
    default = post(client, "/v1/completions", prompt=prompt)
    without = post(client, "/v1/completions", prompt=prompt, add_special_tokens=False)
    assert default["usage"]["prompt_tokens"] == with_bos
    assert without["usage"]["prompt_tokens"] == with_bos - 1
    messages = [{"role": "user", "content": prompt}]
    chat = post(client, "/v1/chat/completions", messages=messages)
    chat_bos = post(client, "/v1/chat/completions", messages=messages, add_special_tokens=True)
    expected = chat_prompt_tokens(reference_tokenizer, messages, add_generation_prompt=True)
    assert chat["usage"]["prompt_tokens"] == expected
    assert chat_bos["usage"]["prompt_tokens"] == expected + 1


def test_server_truncate_prompt_tokens(client) -> None:
    body = post(client, "/v1/completions", prompt=LONG_PROMPT, truncate_prompt_tokens=7)
    assert body["usage"]["prompt_tokens"] == 7
    chat = post(client, "/v1/chat/completions", truncate_prompt_tokens=5,
                messages=[{"role": "user", "content": LONG_PROMPT}])
    assert chat["usage"]["prompt_tokens"] == 5
    response = client.post("/v1/completions", content=json.dumps(
        {"model": SERVED, "prompt": "hi", "truncate_prompt_tokens": 0}))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "truncate_prompt_tokens"


def test_server_chat_template_option_is_used(client, reference_tokenizer) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    body = post(client, "/v1/chat/completions", messages=messages)
    # The --chat-template's rendering, not the tokenizer's own ChatML one.
    assert body["usage"]["prompt_tokens"] == chat_prompt_tokens(
        reference_tokenizer, messages, add_generation_prompt=True
    )


def test_server_continue_final_message_and_echo(client, reference_tokenizer) -> None:
    messages = [
        {"role": "user", "content": "tell me a story"},
        {"role": "assistant", "content": "the quick brown"},
    ]
    continued = post(client, "/v1/chat/completions", messages=messages, temperature=0,
                     add_generation_prompt=False, continue_final_message=True, echo=True)
    assert continued["usage"]["prompt_tokens"] == chat_prompt_tokens(
        reference_tokenizer, messages, add_generation_prompt=False, continue_final_message=True
    )
    closed = post(client, "/v1/chat/completions", messages=messages, temperature=0,
                  add_generation_prompt=False)
    assert closed["usage"]["prompt_tokens"] > continued["usage"]["prompt_tokens"]
    content = continued["choices"][0]["message"]["content"]
    plain = post(client, "/v1/chat/completions", messages=messages, temperature=0,
                 add_generation_prompt=False, continue_final_message=True)
    assert content == "the quick brown" + plain["choices"][0]["message"]["content"]
    # streamed: the echo comes first
    with client.stream("POST", "/v1/chat/completions", content=json.dumps({
        "model": SERVED, "messages": messages, "max_tokens": 3, "stream": True, "echo": True,
        "temperature": 0, "add_generation_prompt": False, "continue_final_message": True,
    })) as response:
        text = "".join(
            choice["delta"].get("content", "")
            for chunk in _sse_chunks(response)
            for choice in chunk["choices"]
        )
    assert text == content
    response = client.post("/v1/chat/completions", content=json.dumps(
        {"model": SERVED, "messages": messages, "continue_final_message": True}))
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "continue_final_message"


def _sse_chunks(response):
    for line in response.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: "):])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_server_continuous_usage_stats(client, path) -> None:
    body = {"model": SERVED, "max_tokens": 5, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    body.update({"messages": [{"role": "user", "content": "hi"}]} if "chat" in path
                else {"prompt": "hi"})
    with client.stream("POST", path, content=json.dumps(body)) as response:
        chunks = list(_sse_chunks(response))
    usages = [chunk["usage"] for chunk in chunks]
    assert all(usage is not None for usage in usages)
    completion_tokens = [usage["completion_tokens"] for usage in usages]
    assert completion_tokens == sorted(completion_tokens) and completion_tokens[-1] == 5
    assert len({usage["prompt_tokens"] for usage in usages}) == 1


def test_server_bad_words(client) -> None:
    base = {"prompt": LONG_PROMPT, "temperature": 0, "max_tokens": 6, "ignore_eos": True,
            "logprobs": 1}
    plain = post(client, "/v1/completions", **base)["choices"][0]
    first = plain["logprobs"]["tokens"][0]
    assert first.strip()
    banned = post(client, "/v1/completions", **base, bad_words=[first])["choices"][0]
    assert banned["logprobs"]["tokens"][0] != first
    assert first.strip() not in banned["text"]


def test_server_cache_salt(client, server) -> None:
    from tests.entrypoints.server_process import read_metrics

    def hits_after(salt: str) -> float:
        before = read_metrics(server)["vllm:prefix_cache_hits_total"]
        post(client, "/v1/completions", prompt=LONG_PROMPT + " salted", max_tokens=1,
             cache_salt=salt)
        time.sleep(0.5)  # the engine's stats reach the API with its next output
        return read_metrics(server)["vllm:prefix_cache_hits_total"] - before

    hits_after("alice")
    assert hits_after("alice") >= 16
    assert hits_after("bob") == 0


def test_server_max_logprobs_and_disabled_stats_log(client, server) -> None:
    post(client, "/v1/completions", prompt="hi", logprobs=5)
    response = client.post("/v1/completions", content=json.dumps(
        {"model": SERVED, "prompt": "hi", "max_tokens": 2, "logprobs": 6}))
    assert response.status_code == 400
    assert "max-logprobs" in response.text
    time.sleep(0.5)  # several --stats-interval periods after requests ran
    assert "[ladle] running" not in server.log()


# ----- every field, one at a time --------------------------------------------------------------

COMPLETION_BASE = {"prompt": LONG_PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
CHAT_BASE = {
    "messages": [{"role": "user", "content": "hello there"}],
    "max_tokens": 6, "temperature": 0, "ignore_eos": True,
}
RANDOM = {"temperature": 1.0, "seed": 0}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CONVERSATION = [
    {"role": "user", "content": "tell me a story"},
    {"role": "assistant", "content": "the quick brown"},
]

# field -> (endpoint, extra base fields, the field's value). The request with the field must
# differ observably (body, usage, stream) from the one without; callables get the tokenizer.
HONOURED_ROWS = {
    "model": ("completions", {}, "not-this-model"),
    "prompt": ("completions", {}, "a different prompt"),
    "messages": ("chat", {}, [{"role": "user", "content": "something else entirely"}]),
    "n": ("completions", {}, 2),
    "temperature": ("completions", {"seed": 0}, 1.5),
    "top_p": ("completions", RANDOM, 0.01),
    "top_k": ("completions", RANDOM, 1),
    "min_p": ("completions", RANDOM, 0.99),
    "seed": ("completions", RANDOM, 1),
    "presence_penalty": ("completions", {"max_tokens": 16}, 2.0),
    "frequency_penalty": ("completions", {"max_tokens": 16}, 2.0),
    "repetition_penalty": ("completions", {"max_tokens": 16}, 2.0),
    "max_tokens": ("completions", {}, 2),
    "max_completion_tokens": ("chat", {"max_tokens": None}, 2),
    "logprobs": ("completions", {}, 2),
    "top_logprobs": ("chat", {"logprobs": True}, 3),
    "echo": ("completions", {}, True),
    "stream": ("completions", {}, True),
    "stream_options": ("completions", {"stream": True}, {"include_usage": True}),
    "logit_bias": ("completions", {}, {"11": 100}),
    "allowed_token_ids": ("completions", {}, [7, 9]),
    "stop_token_ids": ("completions", {"allowed_token_ids": [7, 9]}, [7, 9]),
    "min_tokens": ("completions", {"allowed_token_ids": [7, 9], "stop_token_ids": [7, 9]}, 3),
    "ignore_eos": ("completions", {"ignore_eos": False, "logit_bias": "EOS+100"}, True),
    "skip_special_tokens": ("completions", {"logit_bias": "EOS+100"}, False),
    "stop": ("completions", {"allowed_token_ids": [7, 9]}, "TEXT_OF_7"),
    "include_stop_str_in_output": (
        "completions", {"allowed_token_ids": [7, 9], "stop": "TEXT_OF_7"}, True
    ),
    "bad_words": ("completions", {"allowed_token_ids": [7, 9]}, ["TEXT_OF_7"]),
    "response_format": ("completions", {}, {"type": "json_object"}),
    "structured_outputs": ("completions", {}, {"choice": ["yes", "no"]}),
    "truncate_prompt_tokens": ("completions", {}, 3),
    "prompt_logprobs": ("completions", {}, 1),
    "add_special_tokens": ("completions", {}, False),
    "best_of": ("completions", {}, 2),  # best_of != n: a 400 naming it
    "suffix": ("completions", {}, "and then"),  # a 400 naming it
    "tools": ("chat", {}, [TOOL]),
    "tool_choice": ("chat", {"tools": [TOOL]}, "required"),
    "add_generation_prompt": ("chat", {}, False),
    "chat_template_kwargs": ("chat", {}, {"greeting": "good morning"}),
    "continue_final_message": (
        "chat", {"messages": CONVERSATION, "add_generation_prompt": False}, True
    ),
    "chat.echo": ("chat", {"messages": CONVERSATION}, True),
    "chat.add_special_tokens": ("chat", {}, True),
    "return_token_ids": ("completions", {}, True),
    "chat.return_token_ids": ("chat", {}, True),
    "return_tokens_as_token_ids": ("completions", {"logprobs": 1}, True),
    "chat.return_tokens_as_token_ids": ("chat", {"logprobs": True}, True),
}
# Fields whose effect one request cannot show, and where it is checked instead.
HONOURED_ELSEWHERE = {
    "priority": "scheduling order under contention: tests/core/test_scheduler.py",
    "cache_salt": "prefix-cache hits: test_server_cache_salt",
    "parallel_tool_calls": "one call at most under a forced choice: tests/entrypoints/"
    "test_serve_structured.py",
    "user": "no effect by design (OpenAI: an end-user id for abuse monitoring)",
    "kv_transfer_params": "a prefill and a decode server behind a proxy: tests/entrypoints/"
    "test_serve_kv_transfer_proxy.py",
    "return_token_ids": "the ids equal the tokenizer's and the offline LLM's, streamed and not: "
    "tests/entrypoints/test_serve_skip_tokenizer_init.py (completions), tests/entrypoints/"
    "test_serve_chat_token_ids.py (chat)",
}


def test_every_request_field_has_a_row() -> None:
    rows = {name.split(".")[-1] for name in HONOURED_ROWS} | set(HONOURED_ELSEWHERE)
    missing = (set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields)) - rows
    assert not missing, f"request fields with no check of their effect: {sorted(missing)}"


def _resolve(value, tokenizer):
    if value == "TEXT_OF_7":
        return tokenizer.decode([7])
    if value == ["TEXT_OF_7"]:
        return [tokenizer.decode([7])]
    if value == "EOS+100":
        return {str(tokenizer.convert_tokens_to_ids("<|im_end|>")): 100}
    if isinstance(value, dict):
        return {key: _resolve(item, tokenizer) for key, item in value.items()}
    return value


def _observe(client, path: str, body: dict) -> tuple[int, object]:
    body = {key: value for key, value in body.items() if value is not None}
    response = client.post(path, content=json.dumps(body))
    if response.status_code != 200:
        return response.status_code, response.json()["error"]
    if body.get("stream"):
        chunks = [
            {key: value for key, value in chunk.items() if key not in ("id", "created")}
            for chunk in (
                json.loads(line[len("data: "):])
                for line in response.text.splitlines()
                if line.startswith("data: ") and line != "data: [DONE]"
            )
        ]
        return 200, chunks
    return 200, {k: v for k, v in response.json().items() if k not in ("id", "created")}


@pytest.mark.parametrize("row", sorted(HONOURED_ROWS))
def test_each_field_is_honoured_or_refused_by_name(client, reference_tokenizer, row) -> None:
    endpoint, extra, value = HONOURED_ROWS[row]
    name = row.split(".")[-1]
    path = f"/v1/{'chat/completions' if endpoint == 'chat' else 'completions'}"
    base = {**(CHAT_BASE if endpoint == "chat" else COMPLETION_BASE), "model": SERVED}
    base.update(_resolve(extra, reference_tokenizer))
    status, without = _observe(client, path, base)
    assert status == 200, without
    status, with_field = _observe(
        client, path, {**base, name: _resolve(value, reference_tokenizer)}
    )
    if status != 200:
        assert status in (400, 404) and with_field["param"] == name, with_field
        return
    assert with_field != without, f"{name}={value!r} changed nothing"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_refused_field_is_a_400_naming_it(client, name) -> None:
    for endpoint, base in (("chat/completions", CHAT_BASE), ("completions", COMPLETION_BASE)):
        body = {**base, "model": SERVED, name: effective_value(name, endpoint == "chat")}
        response = client.post(f"/v1/{endpoint}", content=json.dumps(body))
        if response.status_code == 200:
            # the endpoint implements it itself (chat's tools): its row above checks the effect
            model = ChatCompletionRequest if endpoint.startswith("chat") else CompletionRequest
            assert name in model.model_fields, f"{name} on /v1/{endpoint} silently accepted"
            continue
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == name


def test_server_prompt_logprobs_match_offline(client, server, bos_model) -> None:
    from ladle import LLM

    body = post(client, "/v1/completions", prompt=LONG_PROMPT, max_tokens=1, prompt_logprobs=2)
    served = body["choices"][0]["prompt_logprobs"]
    llm = LLM(bos_model, **TINY_ENGINE_OPTIONS)
    offline = llm.generate(LONG_PROMPT, SamplingParams(max_tokens=1, prompt_logprobs=2),
                           use_tqdm=False)[0]
    assert served[0] is None and len(served) == len(offline.prompt_logprobs)
    for served_entry, offline_entry in zip(served[1:], offline.prompt_logprobs[1:]):
        assert {int(k): v["rank"] for k, v in served_entry.items()} == {
            k: v.rank for k, v in offline_entry.items()
        }
        for token_id, logprob in offline_entry.items():
            assert served_entry[str(token_id)]["logprob"] == pytest.approx(logprob.logprob,
                                                                           abs=1e-4)
    chat = post(client, "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}],
                prompt_logprobs=0)
    assert len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    for bad in ({"stream": True}, {"prompt_logprobs": 6}):
        response = client.post("/v1/completions", content=json.dumps(
            {"model": SERVED, "prompt": "hi", "prompt_logprobs": 1, **bad}))
        assert response.status_code == 400, response.text
        assert "prompt_logprobs" in response.text


@pytest.mark.parametrize("stream", [False, True])
def test_server_echo_with_logprobs_gives_the_prompt_tokens_too(client, stream) -> None:
    prompt = "the quick brown fox"
    reference = post(client, "/v1/completions", prompt=prompt, max_tokens=1, prompt_logprobs=1)
    prompt_entries = reference["choices"][0]["prompt_logprobs"]
    body = {"model": SERVED, "prompt": prompt, "max_tokens": 3, "temperature": 0,
            "ignore_eos": True, "echo": True, "logprobs": 1, "stream": stream}
    response = client.post("/v1/completions", content=json.dumps(body))
    assert response.status_code == 200, response.text
    if stream:
        chunks = [json.loads(line[6:]) for line in response.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
        parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"]
                 and c["choices"][0]["logprobs"]]
        logprobs = {key: sum((part[key] for part in parts), []) for key in parts[0]}
    else:
        choice = response.json()["choices"][0]
        text, logprobs = choice["text"], choice["logprobs"]
    num_prompt = len(prompt_entries)
    assert text.startswith(prompt) and len(logprobs["tokens"]) == num_prompt + 3
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    for position in range(1, num_prompt):
        own = next(iter(prompt_entries[position].values()))  # the prompt's token comes first
        assert logprobs["token_logprobs"][position] == pytest.approx(own["logprob"], abs=1e-4)
    # offsets run through the prompt tokens' texts (its bos included), then on into the
    # generated text (streamed: by the text each chunk added)
    offsets, tokens = logprobs["text_offset"], logprobs["tokens"]
    expected = [sum(len(token) for token in tokens[:i]) for i in range(num_prompt + 1)]
    assert offsets[: num_prompt + 1] == expected
    assert offsets == sorted(offsets)
