"""From an OpenAI request to SamplingParams, and the length rules a request must meet.

SamplingParams validates every range itself (its ValueError names the field), so this module
only maps names and defaults, and adds the checks that need the model: prompt + max_tokens must
fit in max_model_len (and in the KV pool), and token ids must be in the vocabulary.
"""

from __future__ import annotations

from ladle.entrypoints.openai.errors import BadRequestError, from_value_error
from ladle.entrypoints.openai.protocol import _SamplingFields
from ladle.sampling.params import SamplingParams
from ladle.structured.params import StructuredOutputsParams


def build_sampling_params(
    request: _SamplingFields,
    max_tokens: int,
    logprobs: int | None,
    structured_outputs: StructuredOutputsParams | None = None,
    defaults: dict | None = None,
    vocab_size: int | None = None,
) -> SamplingParams:
    """SamplingParams of a validated request; raises BadRequestError naming a bad field.

    defaults: the model's generation-config values for the fields the request leaves unset.
    """
    defaults = defaults or {}
    if vocab_size is not None:
        _check_token_id_fields(request, vocab_size)
    try:
        return SamplingParams(
            n=request.n,
            temperature=_pick(request.temperature, defaults, "temperature", 1.0),
            top_p=_pick(request.top_p, defaults, "top_p", 1.0),
            top_k=_pick(request.top_k, defaults, "top_k", -1),
            min_p=_pick(request.min_p, defaults, "min_p", 0.0),
            presence_penalty=request.presence_penalty or 0.0,
            frequency_penalty=request.frequency_penalty or 0.0,
            repetition_penalty=_pick(
                request.repetition_penalty, defaults, "repetition_penalty", 1.0
            ),
            seed=request.seed,
            stop=request.stop,
            stop_token_ids=request.stop_token_ids,
            ignore_eos=request.ignore_eos,
            max_tokens=max_tokens,
            min_tokens=request.min_tokens,
            logprobs=logprobs,
            include_stop_str_in_output=request.include_stop_str_in_output,
            skip_special_tokens=request.skip_special_tokens,
            logit_bias=request.logit_bias or None,
            allowed_token_ids=request.allowed_token_ids,
            structured_outputs=structured_outputs,
            cache_salt=request.cache_salt,
            bad_words=request.bad_words or None,
            prompt_logprobs=request.prompt_logprobs,
        )
    except ValueError as error:
        raise from_value_error(error) from error


def _check_token_id_fields(request: _SamplingFields, vocab_size: int) -> None:
    if request.logit_bias:
        for key in request.logit_bias:
            if not key.strip().isdigit():
                raise BadRequestError(
                    f"logit_bias keys must be token ids, got {key!r}", param="logit_bias"
                )
            check_token_ids([int(key)], vocab_size, "logit_bias")
    if request.allowed_token_ids:
        check_token_ids(request.allowed_token_ids, vocab_size, "allowed_token_ids")


def _pick(requested, defaults: dict, name: str, fallback):
    """The request's value; else the model's default; else ladle's."""
    if requested is not None:
        return requested
    return defaults.get(name, fallback)


def resolve_max_tokens(
    requested: int | None,
    num_prompt_tokens: int,
    max_model_len: int,
    prompt_param: str,
    max_tokens_param: str = "max_tokens",
    ceiling: int | None = None,
) -> int:
    """The number of tokens to generate: the request's, or all the room left when it gives
    none. Raises BadRequestError (naming the limit) when the request cannot fit.

    ceiling: the generation config's max_new_tokens (the model's generation_config.json, or
    --override-generation-config's over it), which vLLM applies as the most any request
    generates (the default of those that give none, a cap on those that ask more)."""
    if requested is not None and requested < 1:
        raise BadRequestError(
            f"{max_tokens_param} must be at least 1, got {requested}", param=max_tokens_param
        )
    if num_prompt_tokens == 0:
        raise BadRequestError("the prompt is empty; give at least one token", param=prompt_param)
    if num_prompt_tokens >= max_model_len:
        raise BadRequestError(
            f"This model's maximum context length is {max_model_len} tokens (max_model_len), "
            f"but the prompt has {num_prompt_tokens} tokens, which leaves no room to generate",
            param=prompt_param,
            code="context_length_exceeded",
        )
    room = max_model_len - num_prompt_tokens
    if requested is None:
        requested = room
    elif requested > room:
        raise BadRequestError(
            f"This model's maximum context length is {max_model_len} tokens (max_model_len), "
            f"but {num_prompt_tokens + requested} were requested ({num_prompt_tokens} in the "
            f"prompt, {requested} for the completion); reduce {max_tokens_param} or the prompt",
            param=max_tokens_param,
            code="context_length_exceeded",
        )
    if ceiling is not None:
        requested = min(requested, int(ceiling))
    return requested


def check_token_ids(token_ids: list[int], vocab_size: int, param: str) -> None:
    for token_id in token_ids:
        if not 0 <= token_id < vocab_size:
            raise BadRequestError(
                f"token id {token_id} is outside the vocabulary [0, {vocab_size})", param=param
            )
