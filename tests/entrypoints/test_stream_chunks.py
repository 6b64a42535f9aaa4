"""Streamed chunks encoded without pydantic are the bytes the pydantic models give.

(One difference, in value none: a float of magnitude 1e16 or more is written 1e20 where pydantic
writes 1e+20; a logprob is never one.)
"""

from __future__ import annotations

import itertools
import json

import pytest

from ladle.entrypoints.openai.logprobs import (
    TokenTexts,
    completion_logprobs,
    completion_logprobs_fields,
)
from ladle.entrypoints.openai.protocol import (
    ChatChoiceLogprobs,
    ChatCompletionChunk,
    ChatDelta,
    ChatStreamChoice,
    ChatTokenLogprob,
    ChatTopLogprob,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    UsageInfo,
)
from ladle.entrypoints.openai.stream_chunks import ChunkEncoder, chat_choice, completion_choice
from ladle.entrypoints.openai.streaming import sse_event
from ladle.protocol.messages import TokenLogprobs

# Texts a tokenizer can produce that JSON must escape or keep: quotes, backslashes, control
# characters, the Unicode line separators, U+FFFD of an unfinished character, non-ASCII.
TEXTS = ["", " word", 'q"uote\\back/slash', "tab\tnl\ncr\r\b\f", "\x00\x01\x1f\x7f",
         "\u2028\u0085\ufffd", "émoji 🦊 中文"]
LOGPROBS = [
    None,
    {"text_offset": [0], "token_logprobs": [-1.25], "tokens": [" a"], "top_logprobs": [None]},
    {   # -inf and nan are not JSON: both encoders write null
        "text_offset": [3, 5, 6],
        "token_logprobs": [float("-inf"), -0.0, -2.3e-05],
        "tokens": ["\u2028", '"', "é"],
        "top_logprobs": [{"x\ny": -0.5, "z": float("nan")}, {}, {"w": -1e-7}],
    },
]
ENDINGS = [(None, None), ("length", None), ("stop", 7), ("stop", "</s>")]
USAGES = [None, {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}]


@pytest.mark.parametrize("model", ["qwen3-0.6b", 'a/"b\\c é'])
def test_completion_chunks_are_the_pydantic_models_bytes(model):
    encoder = ChunkEncoder("cmpl-0123abcd", "text_completion", 1_700_000_000, model)
    cases = itertools.product(TEXTS, LOGPROBS, ENDINGS, USAGES, [0, 3])
    for text, logprobs, (finish_reason, stop_reason), usage, index in cases:
        ours = encoder.event(
            [completion_choice(index, text, logprobs, finish_reason, stop_reason)], usage
        )
        reference = CompletionChunk(
            id="cmpl-0123abcd",
            created=1_700_000_000,
            model=model,
            choices=[
                CompletionChoice(
                    index=index,
                    text=text,
                    logprobs=CompletionLogprobs(**logprobs) if logprobs else None,
                    finish_reason=finish_reason,
                    stop_reason=stop_reason,
                )
            ],
            usage=UsageInfo(**usage) if usage else None,
        )
        assert ours == sse_event(reference.model_dump_json()).encode()


def test_several_choices_and_the_usage_only_chunk():
    encoder = ChunkEncoder("cmpl-x", "text_completion", 1, "m")
    choices = [completion_choice(i, f"t{i}", None, None, None) for i in range(3)]
    reference = CompletionChunk(
        id="cmpl-x", created=1, model="m",
        choices=[CompletionChoice(index=i, text=f"t{i}") for i in range(3)],
    )
    assert encoder.event(choices) == sse_event(reference.model_dump_json()).encode()
    usage = UsageInfo(prompt_tokens=1, completion_tokens=2, total_tokens=3)
    final = CompletionChunk(id="cmpl-x", created=1, model="m", choices=[], usage=usage)
    assert encoder.event([], usage.model_dump()) == sse_event(final.model_dump_json()).encode()


def test_logprobs_fields_are_the_models_fields():
    texts = TokenTexts(None)
    entries = [
        TokenLogprobs(5, -0.25, 1, [5, 9], [-0.25, -2.0]),
        TokenLogprobs(9, float("-inf"), 40, [5], [-0.1]),
    ]
    for num_top, offset in [(0, 0), (2, 11)]:
        fields = completion_logprobs_fields(entries, texts, num_top, offset)
        model = completion_logprobs(entries, texts, num_top, offset)
        assert list(fields) == list(CompletionLogprobs.model_fields)
        assert CompletionLogprobs(**fields) == model
        assert fields["text_offset"] == [offset, offset + len("token_id:5")]


def test_chat_chunks_are_the_pydantic_models_bytes():
    encoder = ChunkEncoder("chatcmpl-1", "chat.completion.chunk", 1_700_000_000, "m")
    logprobs = ChatChoiceLogprobs(content=[ChatTokenLogprob(
        token="é", logprob=-2.3e-05, bytes=[195, 169],
        top_logprobs=[ChatTopLogprob(token="a", logprob=float("-inf"), bytes=[97])],
    )])
    for text, (finish_reason, stop_reason), usage in itertools.product(TEXTS, ENDINGS, USAGES):
        plain = chat_choice(2, {"content": text}, finish_reason, stop_reason)
        model = ChatStreamChoice(
            index=2, delta=ChatDelta(content=text), finish_reason=finish_reason,
            stop_reason=stop_reason,
        )
        opening = chat_choice(0, {"role": "assistant", "content": text})
        opening_model = ChatStreamChoice(index=0, delta=ChatDelta(role="assistant", content=text))
        # Choices that stay pydantic models: logprobs, a reasoning or tool-call delta.
        rare = ChatStreamChoice(
            index=1, delta=ChatDelta(reasoning_content=text), logprobs=logprobs,
            finish_reason=finish_reason,
        )
        for ours, models in [([plain], [model]), ([opening], [opening_model]),
                             ([plain, rare], [model, rare])]:
            reference = ChatCompletionChunk(
                id="chatcmpl-1", created=1_700_000_000, model="m", choices=models,
                usage=UsageInfo(**usage) if usage else None,
            )
            assert encoder.event(ours, usage) == sse_event(reference.model_dump_json()).encode()


def test_huge_floats_differ_in_spelling_only():
    encoder = ChunkEncoder("cmpl-x", "text_completion", 1, "m")
    logprobs = {"text_offset": [0], "token_logprobs": [-1e20], "tokens": ["a"],
                "top_logprobs": [None]}
    ours = encoder.event([completion_choice(0, "a", logprobs, None, None)])
    reference = CompletionChunk(id="cmpl-x", created=1, model="m", choices=[
        CompletionChoice(index=0, text="a", logprobs=CompletionLogprobs(**logprobs))
    ]).model_dump_json()
    assert json.loads(ours.removeprefix(b"data: ")) == json.loads(reference)


def test_return_token_ids_fields_are_the_pydantic_models_bytes():
    """chat's return_token_ids: the opening chunk's prompt_token_ids (after usage), each
    choice's token_ids (plain dicts and models alike); completions' on the choice."""
    encoder = ChunkEncoder("chatcmpl-1", "chat.completion.chunk", 1, "m")
    usage = {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}
    for prompt_ids, token_ids, chunk_usage in [
        ([5, 0, 70000], None, None), ([1], [], usage), (None, [2, 3], None), (None, None, usage)
    ]:
        plain = chat_choice(0, {"content": "a"}, "stop", None, token_ids)
        model = ChatStreamChoice(index=0, delta=ChatDelta(content="a"), finish_reason="stop",
                                 token_ids=token_ids)
        rare = ChatStreamChoice(index=1, delta=ChatDelta(reasoning_content="b"),
                                token_ids=token_ids)
        reference = ChatCompletionChunk(
            id="chatcmpl-1", created=1, model="m", choices=[model, rare],
            usage=UsageInfo(**chunk_usage) if chunk_usage else None,
            prompt_token_ids=prompt_ids,
        )
        ours = encoder.event([plain, rare], chunk_usage, prompt_ids)
        assert ours == sse_event(reference.model_dump_json()).encode()
        assert ("token_ids" in json.loads(ours[6:])["choices"][0]) == (token_ids is not None)
    completion = ChunkEncoder("cmpl-1", "text_completion", 1, "m")
    reference = CompletionChunk(id="cmpl-1", created=1, model="m", choices=[
        CompletionChoice(index=0, text="a", prompt_token_ids=[4, 5], token_ids=[6])
    ])
    assert completion.event([completion_choice(0, "a", None, None, None, [4, 5], [6])]) == (
        sse_event(reference.model_dump_json()).encode()
    )
