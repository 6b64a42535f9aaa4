"""The prefix key of an OpenAI request body, computed in the ingress before a replica is chosen.

It tokenizes the prompt the way the replica will (chat messages through the chat template), so
the key is the engine's block hash of the prompt's first blocks. A body that does not parse gets
no key: the replica it lands on answers the 400.

Only the prompt's first blocks count, so only the start of a text prompt is encoded: a long
prompt's full encoding cost the front ~3.6 ms of CPU per request at 1,500 tokens (as much as
relaying ~50 tokens), its start ~0.2 ms.
"""

from __future__ import annotations

import json
from typing import Any

from ladle.entrypoints.cluster.prefix_routing import prefix_routing_key

# Text encoded for the first N tokens: N x this many characters, doubled until it holds N +
# _BOUNDARY_TOKENS tokens (tokens far enough from the cut are the full text's).
_CHARS_PER_TOKEN = 8
_BOUNDARY_TOKENS = 16


def leading_token_ids(
    tokenizer: Any, text: str, num_tokens: int | None, add_special_tokens: bool = True
) -> list[int]:
    """The first num_tokens token ids of the text's encoding (all of them for None), encoding
    only as much of the text as they need."""
    if num_tokens is not None:
        num_chars = max(num_tokens, 1) * _CHARS_PER_TOKEN
        while num_chars < len(text):
            ids = tokenizer.encode(text[:num_chars], add_special_tokens=add_special_tokens)
            if len(ids) >= num_tokens + _BOUNDARY_TOKENS:
                return ids[:num_tokens]
            num_chars *= 2
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    return ids if num_tokens is None else ids[:num_tokens]


def prompt_token_ids(
    path: str, body: bytes, tokenizer: Any, num_tokens: int | None = None
) -> list[int] | None:
    """The prompt's token ids (the first prompt's, for a batch; its first num_tokens when given),
    or None when unknown."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(request, dict):
        return None
    if path.endswith("/chat/completions"):
        messages = request.get("messages")
        if tokenizer is None or not isinstance(messages, list):
            return None
        try:
            text = tokenizer.render_chat_template(
                messages, **dict(request.get("chat_template_kwargs") or {})
            )
            # The template wrote the special tokens itself (as apply_chat_template encodes).
            return leading_token_ids(tokenizer, text, num_tokens, add_special_tokens=False)
        except Exception:  # noqa: BLE001 - a bad body is the replica's to reject
            return None
    if path.endswith("/completions"):
        prompt = request.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch: route by its first prompt (a list of ints is one)
        if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
            return prompt
        if isinstance(prompt, str) and tokenizer is not None:
            return leading_token_ids(tokenizer, prompt, num_tokens)
    return None


def request_routing_key(
    path: str, body: bytes, tokenizer: Any, block_size: int, num_prefix_blocks: int
) -> int | None:
    token_ids = prompt_token_ids(path, body, tokenizer, block_size * num_prefix_blocks)
    if token_ids is None:
        return None
    return prefix_routing_key(token_ids, block_size, num_prefix_blocks)
