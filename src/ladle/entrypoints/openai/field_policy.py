"""No request field is silently ignored: each one is honoured, or refused with a 400 naming it.

The request models in protocol.py hold the fields ladle implements. Every other field that
OpenAI or vLLM defines is listed in REFUSED with the reason ladle gives; it is a 400 when it is
sent with a value that would change the result (anything but null or the no-op value listed in
NO_OP_VALUES), so clients that send defaults keep working. A field unknown to both APIs is a 400
too, unless the server runs with --allow-unknown-fields (for clients that add their own keys).

One table, so that landing a feature is one row: when structured output or tools arrive, their
rows leave REFUSED and their fields join the request models.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from ladle.entrypoints.openai.errors import BadRequestError

_STRUCTURED = "structured output is not supported yet"
_TOOLS = "tool calling is not supported yet"

# field -> why ladle refuses it. Both endpoints unless CHAT_ONLY / COMPLETIONS_ONLY say so.
REFUSED: dict[str, str] = {
    # structured output and tools (a separate issue): 400 until they land
    "response_format": _STRUCTURED,
    "structured_outputs": _STRUCTURED,
    "guided_json": _STRUCTURED,
    "guided_regex": _STRUCTURED,
    "guided_choice": _STRUCTURED,
    "guided_grammar": _STRUCTURED,
    "guided_decoding_backend": _STRUCTURED,
    "guided_whitespace_pattern": _STRUCTURED,
    "tools": _TOOLS,
    "tool_choice": _TOOLS,
    "parallel_tool_calls": _TOOLS,
    "functions": _TOOLS,
    "function_call": _TOOLS,
    "reasoning_effort": "reasoning effort is not supported (ladle runs no reasoning parser)",
    # sampling and prompt extras of vLLM not implemented by ladle's sampler yet
    "bad_words": "bad_words is not supported yet",
    "prompt_logprobs": "prompt logprobs are not computed",
    "truncate_prompt_tokens": "truncate_prompt_tokens is not supported yet",
    "use_beam_search": "beam search is not supported",
    "length_penalty": "beam search is not supported",
    "spaces_between_special_tokens": "spaces_between_special_tokens is not supported",
    "return_tokens_as_token_ids": "return_tokens_as_token_ids is not supported",
    "cache_salt": "cache_salt is not supported (the prefix cache is shared by all requests)",
    "continue_final_message": "continue_final_message is not supported yet",
    "add_special_tokens": "add_special_tokens is not supported yet",
    "echo": "echo on chat completions is not supported",
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
    "kv_transfer_params": "KV transfer is not supported",
    "vllm_xargs": "vllm_xargs is not supported",
    "request_id": "client-chosen request ids are not supported",
    "logits_processors": "custom logits processors are not supported",
    "priority_override": "not supported",
}
# Fields each endpoint implements itself (in its request model) even though the other does not.
CHAT_ONLY_REFUSED = frozenset({"echo", "continue_final_message", "chat_template", "documents"})

# Values that change nothing, so sending them is accepted even where the field is refused.
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "response_format": ({"type": "text"},),
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none",),
    "function_call": ("none",),
    "bad_words": ([],),
    "echo": (False,),
    "continue_final_message": (False,),
    "use_beam_search": (False,),
    "store": (False,),
    "return_tokens_as_token_ids": (False,),
    "spaces_between_special_tokens": (True,),
    "length_penalty": (1.0, 1),
    "modalities": (["text"],),
}
# stream_options keys beyond include_usage.
REFUSED_STREAM_OPTIONS = {
    "continuous_usage_stats": "stream_options.continuous_usage_stats is not supported yet",
}


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
    no_op_values = {**NO_OP_VALUES, "add_special_tokens": (not is_chat,)}
    for name, value in body.items():
        if name in REFUSED and (is_chat or name not in CHAT_ONLY_REFUSED):
            if value is None or _is_no_op(value, no_op_values.get(name, ())):
                continue
            raise BadRequestError(f"{name}: {REFUSED[name]}", param=name)
        if name in known:
            continue
        if not allow_unknown_fields:
            raise BadRequestError(
                f"unknown field {name!r}; ladle refuses fields it would ignore (start the server "
                "with --allow-unknown-fields to accept them)",
                param=name,
            )
    options = body.get("stream_options")
    if isinstance(options, dict):
        for name, value in options.items():
            if name in REFUSED_STREAM_OPTIONS:
                if value:
                    raise BadRequestError(
                        REFUSED_STREAM_OPTIONS[name], param=f"stream_options.{name}"
                    )
            elif name != "include_usage" and not allow_unknown_fields:
                raise BadRequestError(
                    f"unknown field 'stream_options.{name}'", param=f"stream_options.{name}"
                )


def _is_no_op(value: Any, no_op_values: tuple[Any, ...]) -> bool:
    return any(value == no_op and type(value) is type(no_op) for no_op in no_op_values)
