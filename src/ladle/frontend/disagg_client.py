"""DisaggregatedClient: one endpoint over a prefill (producer) and a decode (consumer) engine.

    API process                         prefill engine (kv_producer)   decode engine (kv_consumer)
    add_request --AddRequests + {"do_remote_decode"}-->  prompt + first token, holds the KV
    <--first token, finish 'remote_decode', handoff--
    output processor: the first token streams now (stop strings, logprobs as with one engine)
    --AddRequests + handoff + first token ------------------------------->  pulls the blocks it
    <--later tokens ------------------------------------------------------  lacks, decodes
    --AbortRequests (release) --> frees the held blocks (after the decode's first output)

The client is an AsyncEngineClient whose "engine" is the pair: requests, streams, the output
processor, admission and metrics are the base class's; what reaches an engine goes through
_send, which routes it, and every step of either engine goes through _on_step. The first token
is the producer's and is emitted once: the consumer's request carries it as an output already.

Faults. A dead prefill engine: requests still in their prefill are sent whole to the decode
engine (nothing had streamed yet), and a consumer whose pull fails computes the prompt itself,
so requests in flight survive. A dead decode engine: its requests fail with the reason and their
held KV is released on the prefill engine (one that had streamed nothing yet is re-sent whole
to the prefill engine). /health reports the server degraded (503) until the dead engine is
restarted under the usual restart policy.

Routing: with min_prompt_tokens, a shorter prompt is not split but runs whole on the less busy
engine (both engines serve plain requests too), so short traffic gets two aggregated replicas
and long prompts the split; `ladle bench serve --compare-disaggregation` says where the line
pays. With the `auto` policy (disagg_routing.py) the line follows the measured prompt rate: a
prompt runs whole when its prefill would stall running streams by no more than the ITL budget.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import msgspec

from ladle.frontend.admission import AdmissionController
from ladle.frontend.client import AsyncEngineClient, EngineDeadError, EngineInfo
from ladle.frontend.disagg_routing import SplitPolicy
from ladle.frontend.metrics import ServerMetrics
from ladle.frontend.restart_policy import RestartPolicy
from ladle.kv_transfer.shm import remove_exported_pools
from ladle.protocol import wire
from ladle.protocol.messages import EngineCoreRequest, SchedulerStats

PREFILL, DECODE = "prefill", "decode"
WHOLE = "whole"  # a short prompt run start to end on one engine, as on an aggregated replica
REMOTE_DECODE = "remote_decode"
# Disaggregation counters of either engine (a consumer's pulls, a producer's holds), summed.
_SUMMED = ("num_kv_pulls", "num_kv_pull_blocks", "kv_pull_bytes", "kv_pull_seconds",
           "num_kv_pulls_failed", "num_kv_pulls_too_late", "num_kv_handoffs",
           "num_kv_handoffs_held", "num_kv_handoff_blocks_held", "num_kv_handoffs_expired")


class EngineInstance(AsyncEngineClient):
    """One engine process of the pair: started, watched and restarted as a single server's
    engine is, but its outputs and its death go to the DisaggregatedClient."""

    def __init__(self, role: str, router: DisaggregatedClient, options: dict,
                 restart_policy: RestartPolicy | None, on_fatal: Callable[[str], None] | None):
        super().__init__(options, router.metrics, router.admission,
                         startup_timeout_s=router.startup_timeout_s,
                         restart_policy=restart_policy, on_fatal=on_fatal)
        self.role = role
        self.router = router
        self.last_pid: int | None = None

    def _go_live(self, ready: wire.EngineReady) -> None:
        super()._go_live(ready)
        self.last_pid = self.engine_pid
        self.router._on_instance_live(self)

    def _apply_step(self, step: wire.EngineStep) -> None:
        self.router._on_step(self, step)

    def _mark_dead(self, reason: str) -> None:
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        if self._reader_task is not None and self._reader_task is not asyncio.current_task():
            self._reader_task.cancel()
        if self.last_pid is not None:
            remove_exported_pools(self.last_pid)  # a CPU producer's shared-memory pool
        self.router._on_instance_dead(self, reason)

    def send(self, message: wire.EngineInput) -> bool:
        """Send if this engine is up; False (nothing sent) when it is not."""
        if self.dead_reason is not None or self.info is None:
            return False
        try:
            self._send(message)
        except EngineDeadError:
            return False
        return True


@dataclasses.dataclass
class _Route:
    """Where one sequence (a core request) is: its prefill, or its decode."""

    request: EngineCoreRequest
    phase: str = PREFILL
    awaits_release: bool = False  # the prefill engine holds its KV until the decode answers
    engine: str = PREFILL  # the engine its outputs come from now
    streamed: bool = False  # some output of it reached the output processor


class DisaggregatedClient(AsyncEngineClient):
    """The API process's handle on a prefill and a decode engine behind one endpoint."""

    def __init__(
        self,
        engine_options: dict,
        metrics: ServerMetrics,
        admission: AdmissionController,
        startup_timeout_s: float = 1800.0,
        restart_policy: RestartPolicy | None = None,
        on_fatal: Callable[[str], None] | None = None,
        devices: tuple[str, str] | None = None,
        min_prompt_tokens: int = 0,
        split_policy: SplitPolicy | None = None,
    ) -> None:
        """devices: the (prefill, decode) engines' devices, e.g. ("cuda:0", "cuda:1").
        min_prompt_tokens: shorter prompts are not disaggregated: they run whole on the less
        busy engine, the two then serving as aggregated replicas (0: every prompt is split).
        split_policy: instead, the line measured (disagg_routing.py, `auto`)."""
        self.split_policy = split_policy or SplitPolicy.parse(min_prompt_tokens)
        self.num_split = self.num_whole = 0  # prompts routed each way
        super().__init__(engine_options, metrics, admission, startup_timeout_s, restart_policy,
                         on_fatal)
        self.instances: dict[str, EngineInstance] = {}
        for role, kv_role, index in ((PREFILL, "kv_producer", 0), (DECODE, "kv_consumer", 1)):
            options = dict(engine_options, kv_transfer_config={"kv_role": kv_role})
            if devices is not None:
                options["device"] = devices[index]
            self.instances[role] = EngineInstance(role, self, options, restart_policy, on_fatal)
        self._routes: dict[str, _Route] = {}
        self.instance_stats: dict[str, SchedulerStats] = {}
        self.num_retried_on_decode = 0

    @property
    def min_prompt_tokens(self) -> int:
        return self.split_policy.min_prompt_tokens

    @min_prompt_tokens.setter
    def min_prompt_tokens(self, tokens: int) -> None:
        self.split_policy = SplitPolicy.parse(tokens)

    @property
    def prefill(self) -> EngineInstance:
        return self.instances[PREFILL]

    @property
    def decode(self) -> EngineInstance:
        return self.instances[DECODE]

    @property
    def engine_pid(self) -> int | None:
        return self.prefill.engine_pid

    @property
    def engine_pids(self) -> dict[str, int | None]:
        return {role: instance.engine_pid for role, instance in self.instances.items()}

    # ----- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        # One after the other: two tokenizer loads at once race in transformers' lazy imports.
        await self.prefill.start()
        await self.decode.start()
        self.tokenizer = self.decode.tokenizer
        self.info = EngineInfo(
            max_model_len=min(self.prefill.info.max_model_len, self.decode.info.max_model_len),
            memory_budget=f"prefill: {self.prefill.info.memory_budget}; decode: "
            f"{self.decode.info.memory_budget}",
            vocab_size=self.decode.info.vocab_size,
        )
        self.sampling_defaults = dict(self.decode.sampling_defaults)
        self.output_processor = self.decode.output_processor  # the router's from now on
        self.decode.output_processor = None
        self.dead_reason = None
        self._announce()

    def _announce(self) -> None:
        pids = self.engine_pids
        print(f"[ladle] disaggregated: prefill engine in process {pids[PREFILL]}, decode "
              f"engine in process {pids[DECODE]}", flush=True)

    def begin_shutdown(self) -> None:
        self._is_stopping = True
        for instance in self.instances.values():
            instance.begin_shutdown()

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        if self._shutting_down:
            return
        self._shutting_down = self._is_stopping = True
        await asyncio.gather(*(i.shutdown(timeout_s) for i in self.instances.values()))
        for instance in self.instances.values():
            if instance.last_pid is not None:
                remove_exported_pools(instance.last_pid)  # an engine that exited by os._exit
        self._fail_all("the server is shutting down")

    def _on_instance_live(self, instance: EngineInstance) -> None:
        if self.info is not None and all(i.is_alive for i in self.instances.values()):
            self.dead_reason = None
            self._announce()

    def _on_instance_dead(self, instance: EngineInstance, reason: str) -> None:
        if self._shutting_down:
            return
        self.dead_reason = f"degraded: the {instance.role} engine is down ({reason})"
        self.metrics.record_engine_dead()
        survivor = self.decode if instance.role == PREFILL else self.prefill
        for child_id, route in list(self._routes.items()):
            if route.engine != instance.role:
                if instance.role == PREFILL:
                    route.awaits_release = False  # the dead engine's blocks are gone with it
                continue
            if route.streamed:
                self._fail_child(child_id, f"the {instance.role} engine died ({reason})")
                continue
            # Nothing of it streamed yet (a prompt still in its prefill, say): the survivor
            # runs it whole (a decode engine whose pull fails computes the prompt too).
            route.phase, route.engine, route.awaits_release = WHOLE, survivor.role, False
            if survivor.send(wire.AddRequests([route.request])):
                self.num_retried_on_decode += 1
            else:
                self._fail_child(child_id, "both engines are down")

    def _fail_child(self, child_id: str, reason: str) -> None:
        parent_id = self._parent_of.get(child_id)
        buffer = self._buffers.get(parent_id) if parent_id is not None else None
        if buffer is None:
            self._routes.pop(child_id, None)
            return
        self.abort(parent_id)  # its other sequences too, and releases KV on the survivor
        buffer.fail(EngineDeadError(reason))

    def _fail_all(self, reason: str) -> None:
        error = EngineDeadError(reason)
        for request_id, buffer in list(self._buffers.items()):
            buffer.fail(error)
            self._forget(request_id)

    # ----- requests out ----------------------------------------------------------------------

    def _send(self, message: wire.EngineInput) -> None:
        if isinstance(message, wire.AddRequests):
            whole_engine = self._less_busy()
            limit = self.split_policy.line(
                self.instance_stats.get(whole_engine.role), self.instance_stats.get(PREFILL)
            )
            split = [r for r in message.requests if len(r.prompt_token_ids) >= limit]
            whole = [r for r in message.requests if len(r.prompt_token_ids) < limit]
            self.num_split += len(split)
            self.num_whole += len(whole)
            sends = []
            if split:
                sends.append((self.prefill, PREFILL, split, [
                    dataclasses.replace(r, kv_transfer_params={"do_remote_decode": True})
                    for r in split
                ]))
            if whole:
                sends.append((whole_engine, WHOLE, whole, whole))
            for engine, phase, requests, sent in sends:
                for request in requests:  # as the client asked: a retry re-sends it whole
                    self._routes[request.request_id] = _Route(
                        request, phase=phase, engine=engine.role
                    )
                if not engine.send(wire.AddRequests(sent)):
                    for request in message.requests:
                        self._routes.pop(request.request_id, None)
                    raise EngineDeadError(self.dead_reason or f"the {engine.role} engine is down")
        elif isinstance(message, wire.AbortRequests):
            # Both engines: the prefill engine aborts the request or frees its held blocks,
            # the decode engine aborts it (unknown ids are ignored on either side).
            for request_id in message.request_ids:
                self._routes.pop(request_id, None)
            for instance in self.instances.values():
                instance.send(message)
        else:
            for instance in self.instances.values():
                instance.send(message)

    def _less_busy(self) -> EngineInstance:
        """The engine with fewer sequences on it now (the decode engine on a tie)."""
        load = {PREFILL: 0, DECODE: 0}
        for route in self._routes.values():
            load[route.engine] += 1
        return self.prefill if load[PREFILL] < load[DECODE] else self.decode

    def _forget(self, request_id: str) -> None:
        for child_id in self._children.get(request_id, ()):
            route = self._routes.pop(child_id, None)
            if route is not None and route.awaits_release:
                self.prefill.send(wire.AbortRequests([child_id]))
        super()._forget(request_id)

    # ----- outputs in ------------------------------------------------------------------------

    def _on_step(self, instance: EngineInstance, step: wire.EngineStep) -> None:
        if self.output_processor is None:
            return  # before start() finished
        handoffs: list[tuple[str, dict, list[int]]] = []
        outputs = []
        release: list[str] = []
        for output in step.outputs:
            route = self._routes.get(output.request_id)
            if route is None or route.engine != instance.role:
                continue  # aborted or ended, or moved to the other engine: its outputs count
            route.streamed = True
            if route.phase == WHOLE:
                pass
            elif instance.role == PREFILL:
                if output.finish_reason == REMOTE_DECODE:
                    handoffs.append((output.request_id, output.kv_transfer_params or {},
                                     list(output.new_token_ids)))
                    output = msgspec.structs.replace(
                        output, finish_reason=None, kv_transfer_params=None
                    )
                    route.awaits_release = True
            else:
                if route.awaits_release:
                    release.append(output.request_id)  # it has pulled (or given up pulling)
                    route.awaits_release = False
            outputs.append(output)
        if release:
            self.prefill.send(wire.AbortRequests(release))
        stats = None
        if step.stats is not None:
            self.instance_stats[instance.role] = step.stats
            stats = self._combined_stats()
        super()._apply_step(wire.EngineStep(outputs, step.rejections, stats))
        for child_id, params, first_token_ids in handoffs:
            self._hand_to_decode(child_id, params, first_token_ids)

    def _combined_stats(self) -> SchedulerStats:
        """The decode engine's stats, with the requests and the KV pools of both engines
        (so the KV usage gauge returns to 0 only when neither holds a block)."""
        decode = self.instance_stats.get(DECODE) or SchedulerStats()
        prefill = self.instance_stats.get(PREFILL) or SchedulerStats()
        free = decode.num_free_blocks + prefill.num_free_blocks
        total = decode.num_total_blocks + prefill.num_total_blocks
        return dataclasses.replace(
            decode,
            num_running_reqs=decode.num_running_reqs + prefill.num_running_reqs,
            num_waiting_reqs=decode.num_waiting_reqs + prefill.num_waiting_reqs,
            num_free_blocks=free,
            num_total_blocks=total,
            kv_cache_usage=1.0 - free / total if total else 0.0,
            num_prefill_tokens=decode.num_prefill_tokens + prefill.num_prefill_tokens,
            **{name: getattr(decode, name) + getattr(prefill, name) for name in _SUMMED},
        )

    def _hand_to_decode(self, child_id: str, params: dict, first_token_ids: list[int]) -> None:
        route = self._routes.get(child_id)
        if route is None or child_id not in self._parent_of:
            return  # ended by its first token (a stop string) or aborted: already released
        route.phase = route.engine = DECODE
        sampling_params = route.request.sampling_params
        if sampling_params.prompt_logprobs is not None:
            # The prefill engine sent them with the first token.
            sampling_params = dataclasses.replace(sampling_params, prompt_logprobs=None)
        request = dataclasses.replace(
            route.request,
            sampling_params=sampling_params,
            kv_transfer_params=dict(params, first_token_ids=first_token_ids),
        )
        if not self.decode.send(wire.AddRequests([request])):
            self._fail_child(child_id, self.dead_reason or "the decode engine is down")
