"""No request field is silently ignored: each one is honoured, or refused with a 400 naming it.

The request models in protocol.py hold the fields ladle implements. Every other field that
OpenAI or vLLM defines is listed in REFUSED with the reason ladle gives; it is a 400 when it is
sent with a value that would change the result (anything but null or the no-op value listed in
NO_OP_VALUES), so clients that send defaults keep working. A field unknown to both APIs is a 400
too, unless the server runs with --allow-unknown-fields (for clients that add their own keys).

One table, so that landing a feature is one row: it leaves REFUSED and its field joins the
request models (as structured output and tools did).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ladle.entrypoints.openai.errors import BadRequestError
from ladle.entrypoints.openai.protocol import StreamOptions

_GUIDED = "vLLM's older guided_* fields are not supported: use structured_outputs"
# Refused only where the request model lacks them (completions): chat implements them.
_CHAT_FEATURE = "tool calling is a chat feature: use /v1/chat/completions"
_FUNCTIONS = "the deprecated functions / function_call are not supported: use tools"

# field -> why ladle refuses it. Both endpoints unless CHAT_ONLY / COMPLETIONS_ONLY say so.
REFUSED: dict[str, str] = {
    "guided_json": _GUIDED,
    "guided_regex": _GUIDED,
    "guided_choice": _GUIDED,
    "guided_grammar": _GUIDED,
    "guided_decoding_backend": _GUIDED,
    "guided_whitespace_pattern": _GUIDED,
    "tools": _CHAT_FEATURE,
    "tool_choice": _CHAT_FEATURE,
    "parallel_tool_calls": _CHAT_FEATURE,
    "functions": _FUNCTIONS,
    "function_call": _FUNCTIONS,
    "reasoning_effort": "reasoning_effort is not supported (ladle cannot set a model's effort)",
    # sampling and prompt extras of vLLM not implemented by ladle's sampler yet
    "use_beam_search": "beam search is not supported",
    "length_penalty": "beam search is not supported",
    "spaces_between_special_tokens": "spaces_between_special_tokens is not supported",
    "chat_template": "a per-request chat_template is not supported",
    "documents": "documents (RAG templates) are not supported",
    "mm_processor_kwargs": "ladle serves text-only models",
    "audio": "ladle serves text-only models",
    "modalities": "ladle serves text-only models",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is not supported",
    "store": "stored completions are not supported",
    "metadata": "stored completions are not supported",
    "service_tier": "service tiers are not supported",
    "verbosity": "verbosity is not supported",
    "vllm_xargs": "vllm_xargs is not supported",
    "request_id": "client-chosen request ids are not supported",
    "logits_processors": "custom logits processors are not supported",
    "priority_override": "not supported",
}
# Fields each endpoint implements itself (in its request model) even though the other does not.
CHAT_ONLY_REFUSED = frozenset({"chat_template", "documents"})

# Values that change nothing, so sending them is accepted even where the field is refused.
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "tools": ([],),
    "tool_choice": ("none",),
    "parallel_tool_calls": (True,),
    "functions": ([],),
    "function_call": ("none",),
    "use_beam_search": (False,),
    "store": (False,),
    "spaces_between_special_tokens": (True,),
    "length_penalty": (1.0, 1),
    "modalities": (["text"],),
}
# stream_options keys ladle does not implement (StreamOptions holds the ones it does).
REFUSED_STREAM_OPTIONS: dict[str, str] = {}


def check_request_fields(
    body: Any, request_class: type[BaseModel], allow_unknown_fields: bool
) -> None:
    """Raise BadRequestError naming the first field ladle would otherwise ignore.

    body: the decoded JSON object (anything else is left to the model's own validation).
    """
    if not isinstance(body, dict):
        return
    known = set(request_class.model_fields)
    is_chat = "messages" in known
    no_op_values = NO_OP_VALUES
    for name, value in body.items():
        if name in known:
            continue  # the request model holds it: honoured
        if name in REFUSED and (is_chat or name not in CHAT_ONLY_REFUSED):
            if value is None or _is_no_op(value, no_op_values.get(name, ())):
                continue
            raise BadRequestError(f"{name}: {REFUSED[name]}", param=name)
        if not allow_unknown_fields:
            raise BadRequestError(
                f"unknown field {name!r}; ladle refuses fields it would ignore (start the server "
                "with --allow-unknown-fields to accept them)",
                param=name,
            )
    options = body.get("stream_options")
    if options and not body.get("stream"):
        # As vLLM and OpenAI: options of a stream on a request that does not stream.
        raise BadRequestError(
            "stream_options can only be set when stream is true", param="stream_options"
        )
    if isinstance(options, dict):
        for name, value in options.items():
            if name in REFUSED_STREAM_OPTIONS:
                if value:
                    raise BadRequestError(
                        REFUSED_STREAM_OPTIONS[name], param=f"stream_options.{name}"
                    )
            elif name not in StreamOptions.model_fields and not allow_unknown_fields:
                raise BadRequestError(
                    f"unknown field 'stream_options.{name}'", param=f"stream_options.{name}"
                )


def _is_no_op(value: Any, no_op_values: tuple[Any, ...]) -> bool:
    return any(value == no_op and type(value) is type(no_op) for no_op in no_op_values)
