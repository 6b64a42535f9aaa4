"""A request's kv_transfer_params (vLLM's disaggregated-serving proxy protocol), checked.

A proxy sends the prefill server {"do_remote_decode": true} (vLLM's proxies also send
"do_remote_prefill": false and null remote_* fields: the same thing), takes the response's
kv_transfer_params and sends them with the original request to the decode server
(frontend/external_handoffs.py says what happens there). Malformed params are a 400 naming
the field; params that are well formed but stale (the hold expired, the producer is gone) are
not an error: the decode server computes the prompt itself.
"""

from __future__ import annotations

from ladle.entrypoints.openai.errors import BadRequestError
from ladle.frontend.client import AsyncEngineClient

FIELD = "kv_transfer_params"


def check_kv_transfer_params(
    params: dict | None,
    client: AsyncEngineClient,
    *,
    n: int,
    stream: bool,
    wants_logprobs: bool,
    num_prompts: int = 1,
) -> dict | None:
    """The params to send the engine client, or None for a plain request."""
    if params is None:
        return None
    remote_decode = params.get("do_remote_decode") is True
    remote_prefill = params.get("do_remote_prefill") is True
    if not remote_decode and not remote_prefill:
        return None  # a proxy's "nothing remote" (all false or null)
    handoffs = client.external_handoffs
    if handoffs is None:
        raise BadRequestError(
            f"{FIELD} needs a server started with --kv-transfer-config (this one is not a "
            "prefill or decode instance)", param=FIELD,
        )
    if remote_decode and remote_prefill:
        raise BadRequestError(
            f"{FIELD}: do_remote_decode and do_remote_prefill exclude each other", param=FIELD
        )
    if num_prompts != 1:
        raise BadRequestError(f"{FIELD} goes with a single prompt", param="prompt")
    if n != 1:
        raise BadRequestError(f"{FIELD} goes with n = 1", param="n")
    role = handoffs.config.kv_role
    if remote_decode:
        if not handoffs.config.is_producer:
            raise BadRequestError(
                f"{FIELD}.do_remote_decode: this server is a {role}, not a prefill instance "
                "(kv_producer or kv_both)", param=f"{FIELD}.do_remote_decode",
            )
        if stream:
            raise BadRequestError(
                f"{FIELD}.do_remote_decode: the prefill request is not streamed (its answer "
                "carries the params for the decode instance)", param="stream",
            )
        return {"do_remote_decode": True}
    if not handoffs.config.is_consumer:
        raise BadRequestError(
            f"{FIELD}.do_remote_prefill: this server is a {role}, not a decode instance "
            "(kv_consumer or kv_both)", param=f"{FIELD}.do_remote_prefill",
        )
    if wants_logprobs:
        raise BadRequestError(
            f"{FIELD}.do_remote_prefill: logprobs are not supported on a remote prefill (the "
            "first token's were computed on the prefill instance)", param="logprobs",
        )
    _check_remote_prefill(params, client.info.vocab_size if client.info else None)
    return params


def _check_remote_prefill(params: dict, vocab_size: int | None) -> None:
    """The fields the decode engine needs, by type; it checks them against itself too
    (engine/handoff_params.py: block size, the number of blocks), also naming the field."""
    first = params.get("first_token_ids")
    if (
        not isinstance(first, list) or len(first) != 1
        or not all(type(t) is int and t >= 0 and (vocab_size is None or t < vocab_size)
                   for t in first)
    ):
        raise BadRequestError(
            f"{FIELD}.first_token_ids must hold the prefill instance's one first token id",
            param=f"{FIELD}.first_token_ids",
        )
    blocks = params.get("remote_block_ids")
    if not isinstance(blocks, list) or not all(type(b) is int and b >= 0 for b in blocks):
        raise BadRequestError(
            f"{FIELD}.remote_block_ids must be the prefill instance's block ids",
            param=f"{FIELD}.remote_block_ids",
        )
    for name, kind in (("remote_kv", str), ("remote_request_id", str)):
        if not isinstance(params.get(name), kind) or not params[name]:
            raise BadRequestError(
                f"{FIELD}.{name} is missing: pass the prefill response's kv_transfer_params "
                "unchanged", param=f"{FIELD}.{name}",
            )
    port = params.get("remote_port")
    if port is not None and (type(port) is not int or not 0 < port < 65536):
        raise BadRequestError(f"{FIELD}.remote_port must be a port number",
                              param=f"{FIELD}.remote_port")
