"""POST /v1/kv_transfer/release: a decode server says it holds the KV of prompts this prefill
server handed off (frontend/external_handoffs.py), so their blocks are freed now rather than
at the hold timeout. Only ids this server handed off and has not released yet are acted on: a
release never aborts a running request."""

from __future__ import annotations

import json

from ladle.entrypoints.openai.errors import BadRequestError
from ladle.frontend.client import AsyncEngineClient, EngineDeadError
from ladle.protocol import wire


def release_handoffs(client: AsyncEngineClient, body: bytes) -> int:
    """Free the held KV of the body's request_ids; returns how many were held here."""
    try:
        request_ids = json.loads(body).get("request_ids")
    except (ValueError, AttributeError):
        request_ids = None
    if not isinstance(request_ids, list) or not all(isinstance(i, str) for i in request_ids):
        raise BadRequestError("request_ids must be a list of strings", param="request_ids")
    handoffs = client.external_handoffs
    if handoffs is None:
        raise BadRequestError("this server was not started with --kv-transfer-config")
    held = handoffs.releasable(request_ids)
    if held:
        try:
            client._send(wire.AbortRequests(held))  # the engine frees the held blocks
        except EngineDeadError:
            return 0  # its blocks went with it
    return len(held)
