"""POST /v1/kv_transfer/release: a decode server says it holds the KV of prompts this prefill
server handed off (frontend/external_handoffs.py), so their blocks are freed now rather than
at the hold timeout. Only ids this server handed off and has not released yet, with that
handoff's release_token, are acted on: a release never aborts a running request. The token is
the credential (128 random bits, in the prefill answer's params only), so this route does not
take the API key: the decode server never sends its key to an address a request named."""

from __future__ import annotations

import json

from ladle.entrypoints.openai.errors import BadRequestError
from ladle.frontend.client import AsyncEngineClient, EngineDeadError
from ladle.protocol import wire


def release_handoffs(client: AsyncEngineClient, body: bytes) -> int:
    """Free the held KV of the body's request_ids; returns how many were held here."""
    try:
        fields = json.loads(body)
        request_ids, token = fields.get("request_ids"), fields.get("release_token")
    except (ValueError, AttributeError):
        request_ids = token = None
    if not isinstance(request_ids, list) or not all(isinstance(i, str) for i in request_ids):
        raise BadRequestError("request_ids must be a list of strings", param="request_ids")
    if not isinstance(token, str):
        raise BadRequestError("release_token must be the handoff's token (a string)",
                              param="release_token")
    handoffs = client.external_handoffs
    if handoffs is None:
        raise BadRequestError("this server was not started with --kv-transfer-config")
    held = handoffs.releasable(request_ids, token)
    if held:
        try:
            client._send(wire.AbortRequests(held))  # the engine frees the held blocks
        except EngineDeadError:
            return 0  # its blocks went with it
    return len(held)
