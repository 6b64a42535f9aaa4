"""StubReplica: a stand-in for LadleReplica (entrypoints/cluster/replica.py) with no engine, so
the front of `ladle serve --replicas N` can be loaded to its limit on a machine without GPUs.

It keeps LadleReplica's contract with the front: an `open_slot` call that answers the address
of the replica's own HTTP server and holds until the request naming the slot has ended, a
`metrics_text` call, a `check_health` call. Its HTTP server streams OpenAI completions like
ladle's: one server-sent event per token, every stream advancing one token per "engine step"
(one clock per replica, `step_interval_s`), so N streams on a replica get their tokens in the
same bursts a real engine's batch produces, and the front relays what ladle would send.

Used by the front's capacity bench (front_capacity.py) and the multi-front tests.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from ladle.entrypoints.cluster.replica_http import (
    ReplicaHttpServer,
    ReplicaSlot,
    SlotTable,
    end_slots,
)

STUB_MODEL_NAME = "stub"
_DEFAULT_MAX_TOKENS = 16


class StepClock:
    """One tick per engine step: every stream waiting on `next_step()` wakes on the same tick."""

    def __init__(self, step_interval_s: float) -> None:
        if step_interval_s <= 0:
            raise ValueError(f"step_interval_s must be > 0, got {step_interval_s}")
        self.step_interval_s = step_interval_s
        self._tick: asyncio.Future[None] | None = None
        self._task: asyncio.Task | None = None

    async def next_step(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())
        if self._tick is None:
            self._tick = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._tick)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.step_interval_s)
            tick, self._tick = self._tick, None
            if tick is not None and not tick.done():
                tick.set_result(None)

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _prompt_length(request: dict) -> int:
    prompt = request.get("prompt") or request.get("messages") or ""
    return len(prompt) if isinstance(prompt, list) else max(1, len(str(prompt)) // 4)


class StubCompletionsApp:
    """ASGI app: GET /v1/models, POST /v1/completions and /v1/chat/completions (streamed one
    event per step, or answered whole), anything else 404."""

    def __init__(self, clock: StepClock) -> None:
        self._clock = clock
        self._num_requests = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"]
        if scope["method"] == "GET" and path == "/v1/models":
            models = {"object": "list", "data": [{"id": STUB_MODEL_NAME, "object": "model"}]}
            await _answer(send, 200, json.dumps(models).encode(), b"application/json")
            return
        if scope["method"] != "POST" or not path.endswith("completions"):
            await _answer(send, 404, b'{"error": {"message": "not found"}}', b"application/json")
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        request = json.loads(body)
        self._num_requests += 1
        stream = _Stream(
            f"cmpl-stub-{self._num_requests}",
            is_chat=path.endswith("chat/completions"),
            max_tokens=int(request.get("max_tokens") or _DEFAULT_MAX_TOKENS),
            prompt_tokens=_prompt_length(request),
        )
        if not request.get("stream"):
            for _ in range(stream.max_tokens):
                await self._clock.next_step()
            await _answer(send, 200, json.dumps(stream.whole()).encode(), b"application/json")
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )
        for index in range(stream.max_tokens):
            await self._clock.next_step()
            await send(
                {"type": "http.response.body", "body": stream.token(index), "more_body": True}
            )
        await send({"type": "http.response.body", "body": stream.ending(), "more_body": False})


async def _answer(send: Any, status: int, body: bytes, content_type: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type)],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _Stream:
    """The events of one completion, shaped like ladle's (one choice, one token of text each)."""

    def __init__(self, request_id: str, is_chat: bool, max_tokens: int, prompt_tokens: int) -> None:
        self.request_id = request_id
        self.is_chat = is_chat
        self.max_tokens = max_tokens
        self.prompt_tokens = prompt_tokens
        self.created = int(time.time())

    def _chunk(self, choice: dict, usage: dict | None = None) -> dict:
        kind = "chat.completion.chunk" if self.is_chat else "text_completion"
        chunk = {
            "id": self.request_id,
            "object": kind,
            "created": self.created,
            "model": STUB_MODEL_NAME,
            "choices": [choice] if choice else [],
        }
        if usage is not None:
            chunk["usage"] = usage
        return chunk

    def _choice(self, text: str, finish_reason: str | None) -> dict:
        if self.is_chat:
            return {"index": 0, "delta": {"content": text}, "finish_reason": finish_reason}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}

    def token(self, index: int) -> bytes:
        finish_reason = "length" if index == self.max_tokens - 1 else None
        return _event(self._chunk(self._choice(f" tok{index}", finish_reason)))

    def usage(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.max_tokens,
            "total_tokens": self.prompt_tokens + self.max_tokens,
        }

    def ending(self) -> bytes:
        return _event(self._chunk({}, self.usage())) + b"data: [DONE]\n\n"

    def whole(self) -> dict:
        text = "".join(f" tok{index}" for index in range(self.max_tokens))
        if self.is_chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        kind = "chat.completion" if self.is_chat else "text_completion"
        return {
            "id": self.request_id,
            "object": kind,
            "created": self.created,
            "model": STUB_MODEL_NAME,
            "choices": [{**choice, "finish_reason": "length"}],
            "usage": self.usage(),
        }


class StubReplica:
    """Ray Serve deployment body with LadleReplica's calls; its HTTP server on `host`."""

    async def __init__(self, step_interval_s: float, host: str = "127.0.0.1") -> None:  # type: ignore[misc]
        from ray import serve

        self._replica_id = serve.get_replica_context().replica_id.unique_id
        self._clock = StepClock(step_interval_s)
        self._slots = SlotTable()
        self._http = ReplicaHttpServer(
            end_slots(StubCompletionsApp(self._clock), self._slots), host
        )
        await self._http.start()

    async def metrics_text(self) -> tuple[str, bytes]:
        return self._replica_id, b"# a stub replica has no engine metrics\n"

    async def open_slot(self, routing_key: int | None = None) -> AsyncIterator[ReplicaSlot]:
        slot_id = self._slots.open()
        yield ReplicaSlot(self._replica_id, self._http.base_url, slot_id)
        await self._slots.wait_until_done(slot_id)

    async def check_health(self) -> None:
        """Always healthy: nothing to die."""

    async def __del__(self) -> None:
        self._clock.stop()
        await self._http.stop()


def build_stub_replicas(num_replicas: int, step_interval_s: float) -> tuple[Any, Any]:
    """The stub replicas as the engine deployment `ladle serve --replicas N` deploys (same name,
    same prefix-aware router), and the settings its front routes with (token-id prompts only:
    no tokenizer)."""
    from ray import serve

    from ladle.entrypoints.cluster.app import replica_router_config
    from ladle.entrypoints.cluster.front import ENGINE_DEPLOYMENT_NAME, FrontSettings
    from ladle.entrypoints.cluster.prefix_routing import DEFAULT_LOAD_MARGIN, DEFAULT_PREFIX_BLOCKS

    replica = serve.deployment(StubReplica, name=ENGINE_DEPLOYMENT_NAME).options(
        num_replicas=num_replicas,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=4096,
        health_check_period_s=2.0,
        logging_config={"enable_access_log": False},
        request_router_config=replica_router_config("prefix", DEFAULT_LOAD_MARGIN),
    )
    settings = FrontSettings(
        tokenizer_path=None,
        block_size=16,
        num_prefix_blocks=DEFAULT_PREFIX_BLOCKS,
        num_replicas_asked=num_replicas,
    )
    return replica.bind(step_interval_s), settings
