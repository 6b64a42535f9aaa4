"""kv_transfer_params on a request, as a producer or a consumer engine reads them.

The API process (frontend/disagg_client.py) sends a request first to the producer with
{"do_remote_decode": true}; the producer's last output carries the handoff (handoff_params);
the API process sends the same request to the consumer with that handoff plus the first token:

    {"do_remote_prefill": true, "remote_kv": descriptor, "remote_block_ids": [...],
     "block_size": 16, "sampling_seed": 1234, "first_token_ids": [t0]}

The first token is an output the consumer's request already has (it is not emitted again);
max_tokens, stop checks, penalties and the random stream count it as the producer's.
"""

from __future__ import annotations

from ladle.core.remote_prefill import RemotePrefill
from ladle.core.request import Request
from ladle.kv_transfer.config import KVTransferConfig
from ladle.protocol.messages import RequestRejectedError

PARAMS = "kv_transfer_params"


def apply_transfer_params(
    request: Request,
    params: dict,
    kv_transfer: KVTransferConfig | None,
    block_size: int,
    vocab_size: int,
) -> None:
    """Mark the request as a producer's or a consumer's; RequestRejectedError names the field
    when the params do not fit this engine or the request."""
    if not isinstance(params, dict):
        raise RequestRejectedError(f"{PARAMS} must be an object, got {params!r}")
    if kv_transfer is None:
        raise RequestRejectedError(
            f"{PARAMS} given, but this engine has no kv_transfer_config (not disaggregated)"
        )
    if params.get("do_remote_decode"):
        if not kv_transfer.is_producer:
            raise RequestRejectedError(
                f"{PARAMS}.do_remote_decode: this engine is a {kv_transfer.kv_role}, not a "
                "producer"
            )
        request.remote_decode = True
        return
    if not params.get("do_remote_prefill"):
        return  # nothing asked of this engine
    if not kv_transfer.is_consumer:
        raise RequestRejectedError(
            f"{PARAMS}.do_remote_prefill: this engine is a {kv_transfer.kv_role}, not a consumer"
        )
    peer = params.get("remote_kv")
    if not isinstance(peer, str) or not peer:
        raise RequestRejectedError(f"{PARAMS}.remote_kv must be the producer's pool descriptor")
    if params.get("block_size") != block_size:
        raise RequestRejectedError(
            f"{PARAMS}.block_size={params.get('block_size')!r}: the producer's blocks must hold "
            f"as many tokens as this engine's ({block_size})"
        )
    block_ids = params.get("remote_block_ids")
    num_blocks = -(-request.num_prompt_tokens // block_size)
    # A producer may hold one block more than the prompt's (its overlapped next step had
    # allocated it): only the prompt's are pulled.
    if (
        not isinstance(block_ids, list)
        or len(block_ids) < num_blocks
        or not all(isinstance(i, int) and i >= 0 for i in block_ids)
    ):
        raise RequestRejectedError(
            f"{PARAMS}.remote_block_ids must list the producer's {num_blocks} block ids of the "
            f"{request.num_prompt_tokens}-token prompt"
        )
    first = params.get("first_token_ids")
    if (
        not isinstance(first, list)
        or len(first) != 1
        or not all(isinstance(t, int) and 0 <= t < vocab_size for t in first)
    ):
        raise RequestRejectedError(
            f"{PARAMS}.first_token_ids must hold the producer's one first token id"
        )
    seed = params.get("sampling_seed")
    if seed is not None:
        if not isinstance(seed, int):
            raise RequestRejectedError(f"{PARAMS}.sampling_seed must be an integer")
        request.sampling_seed = seed
    expires_at = params.get("expires_at", float("inf"))
    if not isinstance(expires_at, (int, float)) or isinstance(expires_at, bool):
        raise RequestRejectedError(f"{PARAMS}.expires_at must be a number (monotonic seconds)")
    for token_id in first:
        request.append_output_token(token_id)
    request.remote_prefill = RemotePrefill(peer, list(block_ids[:num_blocks]), expires_at)


def handoff_params(request_id: str, block_ids: list[int], peer: str, block_size: int,
                   sampling_seed: int, expires_at: float) -> dict:
    """What a producer's handoff output tells the API process (and through it the consumer)."""
    return {
        "do_remote_prefill": True,
        "remote_request_id": request_id,
        "remote_kv": peer,
        "remote_block_ids": block_ids,
        "block_size": block_size,
        "sampling_seed": sampling_seed,
        "expires_at": expires_at,
    }
