"""kv_transfer_params over HTTP: vLLM's external-proxy protocol for disaggregated serving.

Two `ladle serve --kv-transfer-config '{"kv_role": "kv_both"}'` servers (or a kv_producer and
a kv_consumer) behind a proxy that speaks vLLM's protocol:

    proxy --POST {..., "kv_transfer_params": {"do_remote_decode": true}}--> prefill server
      <-- one token, finish_reason "length", "kv_transfer_params": {"do_remote_prefill": true,
          "remote_engine_id", "remote_block_ids", "remote_host", "remote_port", ... ladle's}
    proxy --POST {..., "kv_transfer_params": <that object>}--> decode server
      the decode engine pulls the blocks it lacks, emits the prefill's first token, decodes;
      on its first output its API process POSTs /v1/kv_transfer/release to remote_host:port
      (the prefill server), which frees the held blocks at once rather than at the timeout.

ExternalHandoffs is the API process's side of it, on either server: it completes a producer's
handoff with the fields vLLM's proxies pass on (and remembers which ids it may release), and
on a consumer it holds back the first token until the engine's first output (so an engine that
rejects the params answers with a clean 400 and nothing streamed) and sends the release.

Stale params (the hold expired, the producer restarted or died) fall back to computing the
prompt on the decode engine: the same tokens, a slower first token (core/kv_handoff.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import secrets
import time

import msgspec

from ladle.kv_transfer.config import KVTransferConfig
from ladle.protocol.messages import EngineCoreOutput
from ladle.sampling.params import SamplingParams

logger = logging.getLogger("ladle.kv_transfer")

RELEASE_PATH = "/v1/kv_transfer/release"
# A released id is remembered this long: a second decode request with the same params would
# pull blocks that may be someone else's by then, so it computes its prompt instead.
_USED_TTL_S = 600.0
_REMOTE_DECODE = "remote_decode"


class ExternalHandoffs:
    """One server's part in vLLM's proxy protocol (see the module docstring)."""

    def __init__(self, config: KVTransferConfig, host: str, port: int) -> None:
        self.config = config
        # The engines of a pair share a host (the transfer is shared memory or CUDA IPC), so a
        # wildcard bind address is reached through the loopback interface.
        self.host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        self.port = port
        # Producer: handed-off id -> (hold expiry, the token a release must show).
        self._releasable: dict[str, tuple[float, str]] = {}
        # Consumer: request id -> (held-back first token, the release's host, port, id, token).
        self._pending: dict[str, tuple[list[int], str, int, str, str]] = {}
        self._used: dict[tuple[str, str], float] = {}  # consumer: (engine, remote id) -> when
        self._tasks: set[asyncio.Task] = set()
        self.num_releases_sent = 0
        self.num_release_failures = 0

    @property
    def engine_id(self) -> str:
        """remote_engine_id in a prefill's answer: the configured engine_id, else host:port."""
        return self.config.engine_id or f"ladle-{self.host}:{self.port}"

    # ----- producer --------------------------------------------------------------------------

    def on_handoff(self, request_id: str, params: dict, first_token_ids: list[int]) -> dict:
        """The kv_transfer_params a prefill response returns for this handoff: the engine's
        handoff (core/kv_handoff.py), its first token, and where to send the release."""
        now = time.monotonic()
        _drop_oldest(self._releasable, lambda entry: entry[0] <= now)
        token = secrets.token_hex(16)
        self._releasable[request_id] = (float(params.get("expires_at", now + 600.0)), token)
        return dict(
            params,
            release_token=token,
            do_remote_decode=False,
            first_token_ids=first_token_ids,
            remote_engine_id=self.engine_id,
            remote_host=self.host,
            remote_port=self.port,
        )

    def releasable(self, request_ids: list[str], token: str | None = None) -> list[str]:
        """The ids among these that this server handed off and has not released, and (token
        given: a decode server's release) whose handoff's token this is: only those are
        aborted, so a release never ends a running request nor a hold someone else uses."""
        held = []
        for rid in request_ids:
            entry = self._releasable.get(rid)
            if entry is not None and (token is None or secrets.compare_digest(entry[1], token)):
                del self._releasable[rid]
                held.append(rid)
        return held

    # ----- consumer --------------------------------------------------------------------------

    def engine_params(self, request_id: str, params: dict, sampling: SamplingParams,
                      eos_token_ids: tuple[int, ...]) -> dict | None:
        """What a decode request's engine gets: the params (its first token held back until
        the engine's first output), or None when it computes its prompt instead: params
        already used, or a first token that ends the request by itself (max_tokens 1, an end
        token), so the engine has nothing to decode. The producer's hold is released then."""
        first = list(params["first_token_ids"])
        release = (params.get("remote_host"), params.get("remote_port"),
                   params.get("remote_request_id"), params.get("release_token"))
        key = (str(params.get("remote_engine_id")), str(release[2]))
        now = time.monotonic()
        _drop_oldest(self._used, lambda used_at: used_at <= now - _USED_TTL_S)
        ends_at_once = sampling.max_tokens is not None and sampling.max_tokens <= 1 or (
            sampling.min_tokens <= 1
            and (first[0] in sampling.stop_token_ids
                 or (not sampling.ignore_eos and first[0] in eos_token_ids))
        )
        if key in self._used or ends_at_once:
            if key not in self._used:
                self._used[key] = now
                self._send_release(*release)
            return None
        self._used[key] = now
        self._pending[request_id] = (first, *release)
        return params

    def on_outputs(
        self, outputs: list[EngineCoreOutput]
    ) -> tuple[list[EngineCoreOutput], dict[str, dict]]:
        """A step's outputs as the output processor should see them, and the kv_transfer_params
        of the requests handed off in it (request id -> the prefill response's params).

        Producer: a handoff (finish 'remote_decode') becomes a finish by 'length' (the prefill
        response is one token, as vLLM's) with params for the proxy. Consumer: each held-back
        first token goes in front of its request's first engine output, and the producer's
        hold is released (the engine has pulled, or computed the prompt)."""
        handed_off: dict[str, dict] = {}
        if not self._pending and not any(o.finish_reason == _REMOTE_DECODE for o in outputs):
            return outputs, handed_off
        changed = []
        for output in outputs:
            if output.finish_reason == _REMOTE_DECODE:
                if output.kv_transfer_params is not None:
                    handed_off[output.request_id] = self.on_handoff(
                        output.request_id, output.kv_transfer_params, list(output.new_token_ids)
                    )
                output = msgspec.structs.replace(
                    output, finish_reason="length", kv_transfer_params=None
                )
            pending = self._pending.pop(output.request_id, None)
            if pending is not None:
                first, *release = pending
                self._send_release(*release)
                if output.finish_reason not in ("error", "abort"):
                    output = msgspec.structs.replace(
                        output, new_token_ids=first + list(output.new_token_ids)
                    )
            changed.append(output)
        return changed, handed_off

    def forget(self, request_id: str) -> None:
        """A consumer's request ended before its first engine output (aborted, rejected)."""
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            self._send_release(*pending[1:])

    def _send_release(self, host, port, remote_id, token) -> None:
        if not (isinstance(host, str) and isinstance(port, int) and isinstance(remote_id, str)
                and isinstance(token, str)):
            return  # nothing says where: the producer's hold times out instead
        if not self._is_local(host):
            # The pair shares a host (the KV moves through shared memory or CUDA IPC); a
            # request must not make this server call out anywhere else.
            logger.warning("not releasing KV on %s: not this host", host)
            return
        try:
            task = asyncio.get_running_loop().create_task(
                self._post_release(host, port, remote_id, token)
            )
        except RuntimeError:
            return  # no event loop (a unit test): the hold times out
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _is_local(self, host: str) -> bool:
        if host in ("localhost", self.host):
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    async def _post_release(self, host: str, port: int, remote_id: str, token: str) -> None:
        body = json.dumps({"request_ids": [remote_id], "release_token": token}).encode()
        head = (f"POST {RELEASE_PATH} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5.0)
            writer.write(head + body)
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 5.0)
            writer.close()
            if b" 200 " not in status:
                raise OSError(status.decode(errors="replace").strip() or "no answer")
            self.num_releases_sent += 1
        except (TimeoutError, OSError) as error:
            # The hold times out on the producer instead; nothing here is lost.
            self.num_release_failures += 1
            logger.warning("releasing KV held on %s:%s failed: %s", host, port, error)


def _drop_oldest(entries: dict, is_stale) -> None:
    """Remove stale entries from the front of a dict whose values grow in insertion order
    (expiry or use times): amortized O(1) a call, where a rebuild would cost the whole dict."""
    while entries:
        key = next(iter(entries))
        if not is_stale(entries[key]):
            return
        del entries[key]
