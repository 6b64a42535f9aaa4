"""The one table of numeric limits: SamplingParams (ValueError) and the server's request models
(a 400 naming the field) both follow every row, at the edges of each range."""

from __future__ import annotations

import json
import math

import pydantic
import pytest

from ladle import SamplingParams
from ladle.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest
from ladle.sampling.limits import INT32_MAX, INT64_MAX, LIMITS, Limit, check_top_k

# Rows that are SamplingParams fields (priority and best_of are request-level only).
SAMPLING_ROWS = [name for name in LIMITS if name in SamplingParams.__dataclass_fields__]


def edges(limit: Limit) -> tuple[list, list]:
    """(allowed values, refused values) at and just past each end of a row."""
    step = 1 if limit.kind == "int" else 1e-6
    allowed = [limit.high]
    below = limit.low - step if limit.disabled is None else limit.disabled - 1
    refused = [limit.high + step, below]
    if limit.low_exclusive:
        refused.append(limit.low)
    else:
        allowed.append(limit.low)
    if limit.kind == "float":
        refused += [math.inf, -math.inf, math.nan]
    else:
        refused += [True, 1.5]
    if limit.disabled is not None:
        allowed.append(limit.disabled)
    return allowed, refused


def sampling_kwargs(name: str, value) -> dict:
    if name == "stop_token_ids":
        return {"stop_token_ids": [value]}
    if name == "min_tokens":
        return {"min_tokens": value, "max_tokens": None}
    return {name: value}


@pytest.mark.parametrize("name", SAMPLING_ROWS)
def test_sampling_params_follow_every_row(name):
    allowed, refused = edges(LIMITS[name])
    for value in allowed:
        SamplingParams(**sampling_kwargs(name, value))
    for value in refused:
        with pytest.raises(ValueError, match=rf"^{name} must be"):
            SamplingParams(**sampling_kwargs(name, value))


# (request model, field in the request, row it follows)
API_FIELDS = [
    (CompletionRequest, "top_k", "top_k"), (CompletionRequest, "seed", "seed"),
    (CompletionRequest, "priority", "priority"), (CompletionRequest, "max_tokens", "max_tokens"),
    (CompletionRequest, "logprobs", "logprobs"), (CompletionRequest, "n", "n"),
    (CompletionRequest, "temperature", "temperature"), (CompletionRequest, "top_p", "top_p"),
    (CompletionRequest, "best_of", "best_of"),
    (ChatCompletionRequest, "max_completion_tokens", "max_tokens"),
    (ChatCompletionRequest, "top_logprobs", "logprobs"),
    (ChatCompletionRequest, "min_tokens", "min_tokens"),
    (ChatCompletionRequest, "repetition_penalty", "repetition_penalty"),
]


def request_body(model, field: str, value) -> bytes:
    base = {"prompt": "hi"} if model is CompletionRequest else {
        "messages": [{"role": "user", "content": "hi"}]}
    text = json.dumps({**base, field: value})  # json writes NaN / Infinity as JS literals
    return text.encode()


@pytest.mark.parametrize(("model", "field", "row"), API_FIELDS,
                         ids=[f"{m.__name__}.{f}" for m, f, _ in API_FIELDS])
def test_request_models_follow_every_row(model, field, row):
    allowed, refused = edges(LIMITS[row])
    for value in allowed:
        assert getattr(model.model_validate_json(request_body(model, field, value)), field) == value
    for value in refused:
        with pytest.raises(pydantic.ValidationError) as caught:
            model.model_validate_json(request_body(model, field, value))
        error = caught.value.errors()[0]
        assert error["loc"][0] == field


def test_engine_representable_bounds():
    # The rows that guard the engine's packing: int32 rows, int64 across the IPC.
    assert LIMITS["top_k"].high == LIMITS["max_tokens"].high == INT32_MAX
    assert LIMITS["seed"].high == LIMITS["priority"].high == INT64_MAX
    with pytest.raises(ValueError, match="top_k .* vocabulary size 100"):
        check_top_k(101, 100)
    check_top_k(100, 100)
    check_top_k(-1, 100)


def test_offline_engine_refuses_what_the_table_refuses(tiny_model_path):
    """top_k past the vocabulary and an int64-overflowing priority: the request alone fails."""
    from ladle import LLM
    from ladle.entrypoints.llm import RequestErrors

    llm = LLM(tiny_model_path("llama"), block_size=4, max_model_len=64, num_kv_blocks=64)
    vocab_size = llm.engine.vocab_size
    good = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    bad = SamplingParams(temperature=0.5, top_k=vocab_size + 1, max_tokens=3)
    with pytest.raises(RequestErrors) as caught:
        llm.generate([[5, 6, 7], [5, 6, 7]], [good, bad], use_tqdm=False)
    outputs = caught.value.outputs
    assert "vocabulary size" in outputs[1].error
    assert len(outputs[0].outputs[0].token_ids) == 3
    with pytest.raises(RequestErrors, match="priority"):
        llm.generate([[5, 6, 7]], good, priority=[2**64], use_tqdm=False)
