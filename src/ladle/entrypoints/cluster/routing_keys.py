"""The prefix key of an OpenAI request body, computed in the ingress before a replica is chosen.

It tokenizes the prompt the way the replica will (chat messages through the chat template), so
the key is the engine's block hash of the prompt's first blocks. A body that does not parse gets
no key: the replica it lands on answers the 400.
"""

from __future__ import annotations

import json
from typing import Any

from ladle.entrypoints.cluster.prefix_routing import prefix_routing_key


def prompt_token_ids(path: str, body: bytes, tokenizer: Any) -> list[int] | None:
    """The prompt's token ids (the first prompt's, for a batch), or None when unknown."""
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
            return tokenizer.apply_chat_template(
                messages, **dict(request.get("chat_template_kwargs") or {})
            )
        except Exception:  # noqa: BLE001 - a bad body is the replica's to reject
            return None
    if path.endswith("/completions"):
        prompt = request.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch: route by its first prompt (a list of ints is one)
        if isinstance(prompt, list) and all(isinstance(token, int) for token in prompt):
            return prompt
        if isinstance(prompt, str) and tokenizer is not None:
            return tokenizer.encode(prompt)
    return None


def request_routing_key(
    path: str, body: bytes, tokenizer: Any, block_size: int, num_prefix_blocks: int
) -> int | None:
    token_ids = prompt_token_ids(path, body, tokenizer)
    if token_ids is None:
        return None
    return prefix_routing_key(token_ids, block_size, num_prefix_blocks)
