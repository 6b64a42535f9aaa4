"""DisaggregatedClient: one endpoint over x prefill (producer) and y decode (consumer) engines.

    API process                         a prefill engine (kv_producer)  a decode engine (consumer)
    add_request --AddRequests + {"do_remote_decode"}-->  prompt + first token, holds the KV
    <--first token, finish 'remote_decode', handoff--
    output processor: the first token streams now (stop strings, logprobs as with one engine)
    --AddRequests + handoff + first token ------------------------------->  pulls the blocks it
    <--later tokens ------------------------------------------------------  lacks, decodes
    --AbortRequests (release) --> frees the held blocks (after the decode's first output)

The client is an AsyncEngineClient whose "engine" is the set: requests, streams, the output
processor, admission and metrics are the base class's; what reaches an engine goes through
_send, which routes it, and every step of any engine goes through _on_step. The first token
is the producer's and is emitted once: the consumer's request carries it as an output already.

Routing (instance_picking.py): a split prompt goes to the least loaded prefill engine, its
handoff to the least loaded decode engine (the handoff names its producer's pool, so any decode
engine pulls from any prefill engine), and the release to the prefill engine that holds the KV.
With min_prompt_tokens, a shorter prompt is not split but runs whole on the least loaded engine
of all (every engine serves plain requests too), so short traffic gets x + y aggregated
replicas and long prompts the split; `ladle bench serve --compare-disaggregation` says where
the line pays. With the `auto` policy (disagg_routing.py) the line follows the measured prompt
rate: a prompt runs whole when its prefill would stall running streams by no more than the ITL
budget.

Faults, per engine. A dead prefill engine: its requests still in their prefill are sent whole
to the least loaded live engine (nothing had streamed yet), and a consumer whose pull fails
computes the prompt itself, so requests in flight survive. A dead decode engine: its requests
fail with the reason and their held KV is released on their prefill engine (one that had
streamed nothing yet is re-sent whole). While any engine is down /health reports the server
degraded (503), new requests still go to the live engines (whole when no prefill or no decode
engine is left), and the dead engine is restarted under the usual restart policy.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

import msgspec

from ladle.frontend.admission import AdmissionController
from ladle.frontend.client import AsyncEngineClient, EngineDeadError, EngineInfo
from ladle.frontend.disagg_routing import SplitPolicy
from ladle.frontend.engine_instance import EngineInstance
from ladle.frontend.instance_metrics import InstanceStatsCollector
from ladle.frontend.instance_picking import (
    DECODE,
    PREFILL,
    instance_loads,
    least_loaded,
    role_name,
)
from ladle.frontend.metrics import ServerMetrics
from ladle.frontend.restart_policy import RestartPolicy
from ladle.kv_transfer.shm import remove_exported_pools
from ladle.protocol import wire
from ladle.protocol.messages import EngineCoreRequest, SchedulerStats

__all__ = ["DECODE", "PREFILL", "DisaggregatedClient", "EngineInstance"]

WHOLE = "whole"  # a short prompt run start to end on one engine, as on an aggregated replica
REMOTE_DECODE = "remote_decode"
# Counters and pool sizes of every engine (a consumer's pulls, a producer's holds), summed.
_SUMMED = ("num_running_reqs", "num_waiting_reqs", "num_free_blocks", "num_total_blocks",
           "num_prefill_tokens", "num_kv_pulls", "num_kv_pull_blocks", "kv_pull_bytes",
           "kv_pull_seconds", "num_kv_pulls_failed", "num_kv_pulls_too_late",
           "num_kv_handoffs", "num_kv_handoffs_held", "num_kv_handoff_blocks_held",
           "num_kv_handoffs_expired")


@dataclasses.dataclass
class _Route:
    """Where one sequence (a core request) is: its prefill, its decode, or a whole run."""

    request: EngineCoreRequest
    engine: EngineInstance  # the engine its outputs come from now
    phase: str = PREFILL
    holder: EngineInstance | None = None  # the prefill engine holding its KV until released
    streamed: bool = False  # some output of it reached the output processor


class DisaggregatedClient(AsyncEngineClient):
    """The API process's handle on x prefill and y decode engines behind one endpoint."""

    def __init__(
        self,
        engine_options: dict,
        metrics: ServerMetrics,
        admission: AdmissionController,
        startup_timeout_s: float = 1800.0,
        restart_policy: RestartPolicy | None = None,
        on_fatal: Callable[[str], None] | None = None,
        devices: Sequence[str] | None = None,
        min_prompt_tokens: int = 0,
        split_policy: SplitPolicy | None = None,
        num_prefill: int = 1,
        num_decode: int = 1,
    ) -> None:
        """devices: each engine's device, prefill engines first (e.g. cuda:0..cuda:x+y-1).
        min_prompt_tokens: shorter prompts are not disaggregated: they run whole on the least
        busy engine, the engines then serving as aggregated replicas (0: every prompt is split).
        split_policy: instead, the line measured (disagg_routing.py, `auto`)."""
        self.split_policy = split_policy or SplitPolicy.parse(min_prompt_tokens)
        self.num_split = self.num_whole = 0  # prompts routed each way
        super().__init__(engine_options, metrics, admission, startup_timeout_s, restart_policy,
                         on_fatal)
        self.layout = f"{num_prefill}P{num_decode}D"
        self.instances: list[EngineInstance] = []
        for index in range(num_prefill + num_decode):
            kind, role = role_name(index, num_prefill)
            kv_role = "kv_producer" if kind == PREFILL else "kv_consumer"
            options = dict(engine_options, kv_transfer_config={"kv_role": kv_role})
            if devices is not None:
                options["device"] = devices[index]
            self.instances.append(
                EngineInstance(role, self, options, restart_policy, on_fatal, kind=kind)
            )
        self._routes: dict[str, _Route] = {}
        self.instance_stats: dict[str, SchedulerStats] = {}  # by role, live engines only
        self.degraded_reason: str | None = None
        self.num_retried_on_decode = 0  # requests re-sent whole after their engine died
        self.num_routed: Counter[str] = Counter()  # sequences sent to each engine, by role
        metrics.registry.register(InstanceStatsCollector(metrics.model_name, self._view))

    @property
    def min_prompt_tokens(self) -> int:
        return self.split_policy.min_prompt_tokens

    @min_prompt_tokens.setter
    def min_prompt_tokens(self, tokens: int) -> None:
        self.split_policy = SplitPolicy.parse(tokens)

    @property
    def prefills(self) -> list[EngineInstance]:
        return [i for i in self.instances if i.kind == PREFILL]

    @property
    def decodes(self) -> list[EngineInstance]:
        return [i for i in self.instances if i.kind == DECODE]

    @property
    def prefill(self) -> EngineInstance:
        return self.prefills[0]

    @property
    def decode(self) -> EngineInstance:
        return self.decodes[0]

    @property
    def engine_pid(self) -> int | None:
        return self.instances[0].engine_pid

    @property
    def engine_pids(self) -> dict[str, int | None]:
        return {instance.role: instance.engine_pid for instance in self.instances}

    @property
    def health_problem(self) -> str | None:
        return super().health_problem or self.degraded_reason

    def _view(self) -> list[tuple[str, bool, int, SchedulerStats | None]]:
        return [(i.role, i.is_alive, self.num_routed[i.role], self.instance_stats.get(i.role))
                for i in self.instances]

    def _route_to(self, engine: EngineInstance, requests: list[EngineCoreRequest]) -> bool:
        """Send requests to one engine, counted; False when it is down (nothing sent)."""
        if not engine.send(wire.AddRequests(requests)):
            return False
        self.num_routed[engine.role] += len(requests)
        return True

    # ----- life cycle ------------------------------------------------------------------------

    async def start(self) -> None:
        # One after the other: two tokenizer loads at once race in transformers' lazy imports.
        for instance in self.instances:
            await instance.start()
        decode = self.decode
        self.tokenizer = decode.tokenizer
        self.info = EngineInfo(
            max_model_len=min(i.info.max_model_len for i in self.instances),
            memory_budget="; ".join(f"{i.role}: {i.info.memory_budget}" for i in self.instances),
            vocab_size=decode.info.vocab_size,
        )
        self.sampling_defaults = dict(decode.sampling_defaults)
        self.output_processor = decode.output_processor  # the router's from now on
        decode.output_processor = None
        self.dead_reason = self.degraded_reason = None
        self._announce()

    def _announce(self) -> None:
        engines = ", ".join(f"{i.role} in process {i.engine_pid}" for i in self.instances)
        print(f"[ladle] disaggregated {self.layout}: {engines}", flush=True)

    def begin_shutdown(self) -> None:
        self._is_stopping = True
        for instance in self.instances:
            instance.begin_shutdown()

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        if self._shutting_down:
            return
        self._shutting_down = self._is_stopping = True
        await asyncio.gather(*(i.shutdown(timeout_s) for i in self.instances))
        for instance in self.instances:
            if instance.last_pid is not None:
                remove_exported_pools(instance.last_pid)  # an engine that exited by os._exit
        self._fail_all("the server is shutting down")

    def _on_instance_live(self, instance: EngineInstance) -> None:
        if self.info is None:
            return  # start() announces
        # A restart resets the server's engine gauges: the other engines' stats stand again.
        if self.instance_stats:
            self.metrics.record_engine_stats(self._combined_stats())
        if all(i.is_alive for i in self.instances):
            self.dead_reason = self.degraded_reason = None
            self._announce()
        else:
            self.metrics.record_engine_dead()  # ladle:engine_alive: 1 only with every engine up

    def _on_instance_dead(self, instance: EngineInstance, reason: str) -> None:
        if self._shutting_down:
            return
        print(f"[ladle] {instance.role} engine is down: {reason}", flush=True)
        self.degraded_reason = f"degraded: the {instance.role} engine is down ({reason})"
        if not any(i.is_alive for i in self.instances):
            self.dead_reason = f"every engine is down ({reason})"
        self.metrics.record_engine_dead()
        self.instance_stats.pop(instance.role, None)  # its pool is gone with it
        if self.instance_stats:
            self.metrics.record_engine_stats(self._combined_stats())
        for child_id, route in list(self._routes.items()):
            if route.holder is instance:
                route.holder = None  # the dead engine's blocks are gone with it
            if route.engine is not instance:
                continue
            if route.streamed:
                self._fail_child(child_id, f"the {instance.role} engine died ({reason})")
                continue
            # Nothing of it streamed yet (a prompt still in its prefill, say): a live engine
            # runs it whole (a decode engine whose pull fails computes the prompt too).
            survivor = least_loaded(self.instances, instance_loads(
                r.engine for r in self._routes.values()
            ))
            route.phase, route.holder = WHOLE, None
            if survivor is not None and self._route_to(survivor, [route.request]):
                route.engine = survivor
                self.num_retried_on_decode += 1
            else:
                self._fail_child(child_id, "every engine is down")

    def _fail_child(self, child_id: str, reason: str) -> None:
        parent_id = self._parent_of.get(child_id)
        buffer = self._buffers.get(parent_id) if parent_id is not None else None
        if buffer is None:
            self._routes.pop(child_id, None)
            return
        self.abort(parent_id)  # its other sequences too, and releases KV on its holder
        buffer.fail(EngineDeadError(reason))

    def _fail_all(self, reason: str) -> None:
        error = EngineDeadError(reason)
        for request_id, buffer in list(self._buffers.items()):
            buffer.fail(error)
            self._forget(request_id)

    # ----- requests out ----------------------------------------------------------------------

    def _send(self, message: wire.EngineInput) -> None:
        if isinstance(message, wire.AddRequests):
            self._add(message.requests)
            return
        if isinstance(message, wire.AbortRequests):
            # Every engine: a prefill engine aborts the request or frees its held blocks, a
            # decode engine aborts it (unknown ids are ignored on either side).
            for request_id in message.request_ids:
                self._routes.pop(request_id, None)
        for instance in self.instances:
            instance.send(message)

    def _add(self, requests: list[EngineCoreRequest]) -> None:
        loads = instance_loads(route.engine for route in self._routes.values())
        whole_engine = least_loaded(self.instances, loads)
        if whole_engine is None:
            raise EngineDeadError(self.dead_reason or "every engine is down")
        prefill = least_loaded(self.prefills, loads)
        if prefill is None or not any(i.is_alive for i in self.decodes):
            limit = None  # no split possible now: everything runs whole
        else:
            limit = self.split_policy.line(
                self.instance_stats.get(whole_engine.role), self.instance_stats.get(prefill.role)
            )
        split = [r for r in requests if limit is not None and len(r.prompt_token_ids) >= limit]
        whole = [r for r in requests if limit is None or len(r.prompt_token_ids) < limit]
        self.num_split += len(split)
        self.num_whole += len(whole)
        sends = []
        if split:
            sends.append((prefill, PREFILL, split, [
                dataclasses.replace(r, kv_transfer_params={"do_remote_decode": True})
                for r in split
            ]))
        if whole:
            sends.append((whole_engine, WHOLE, whole, whole))
        for engine, phase, originals, sent in sends:
            for request in originals:  # as the client asked: a retry re-sends it whole
                self._routes[request.request_id] = _Route(request, engine, phase=phase)
            if not self._route_to(engine, sent):
                for request in requests:
                    self._routes.pop(request.request_id, None)
                raise EngineDeadError(self.dead_reason or f"the {engine.role} engine is down")

    def _forget(self, request_id: str) -> None:
        for child_id in self._children.get(request_id, ()):
            route = self._routes.pop(child_id, None)
            if route is not None and route.holder is not None:
                route.holder.send(wire.AbortRequests([child_id]))
        super()._forget(request_id)

    # ----- outputs in ------------------------------------------------------------------------

    def _on_step(self, instance: EngineInstance, step: wire.EngineStep) -> None:
        if self.output_processor is None:
            return  # before start() finished
        handoffs: list[tuple[str, dict, list[int]]] = []
        outputs = []
        release: dict[int, tuple[EngineInstance, list[str]]] = {}
        for output in step.outputs:
            route = self._routes.get(output.request_id)
            if route is None or route.engine is not instance:
                continue  # aborted or ended, or moved to another engine: its outputs count
            route.streamed = True
            if route.phase == PREFILL:
                if output.finish_reason == REMOTE_DECODE:
                    handoffs.append((output.request_id, output.kv_transfer_params or {},
                                     list(output.new_token_ids)))
                    output = msgspec.structs.replace(
                        output, finish_reason=None, kv_transfer_params=None
                    )
                    route.holder = instance
            elif route.phase == DECODE and route.holder is not None:
                # It has pulled (or given up pulling): its prefill engine frees the blocks.
                release.setdefault(id(route.holder), (route.holder, []))[1].append(
                    output.request_id
                )
                route.holder = None
            outputs.append(output)
        for holder, request_ids in release.values():
            holder.send(wire.AbortRequests(request_ids))
        stats = None
        if step.stats is not None:
            self.instance_stats[instance.role] = step.stats
            stats = self._combined_stats()
        super()._apply_step(wire.EngineStep(outputs, step.rejections, stats))
        for child_id, params, first_token_ids in handoffs:
            self._hand_to_decode(child_id, params, first_token_ids)

    def _combined_stats(self) -> SchedulerStats:
        """A decode engine's stats, with the requests, KV pools and disaggregation counters of
        every live engine summed (so the KV usage gauge returns to 0 only when no engine holds
        a block)."""
        measured = [self.instance_stats[i.role] for i in self.instances
                    if i.role in self.instance_stats]
        if not measured:
            return SchedulerStats()
        base = next((self.instance_stats[i.role] for i in self.decodes
                     if i.role in self.instance_stats), measured[0])
        summed = {name: sum(getattr(s, name) for s in measured) for name in _SUMMED}
        total, free = summed["num_total_blocks"], summed["num_free_blocks"]
        return dataclasses.replace(
            base, **summed, kv_cache_usage=1.0 - free / total if total else 0.0
        )

    def _hand_to_decode(self, child_id: str, params: dict, first_token_ids: list[int]) -> None:
        route = self._routes.get(child_id)
        if route is None or child_id not in self._parent_of:
            return  # ended by its first token (a stop string) or aborted: already released
        decode = least_loaded(self.decodes, instance_loads(
            r.engine for r in self._routes.values()
        ))
        if decode is None:
            self._fail_child(child_id, self.degraded_reason or "no decode engine is up")
            return
        route.phase, route.engine = DECODE, decode
        sampling_params = route.request.sampling_params
        if sampling_params.prompt_logprobs is not None:
            # The prefill engine sent them with the first token.
            sampling_params = dataclasses.replace(sampling_params, prompt_logprobs=None)
        request = dataclasses.replace(
            route.request,
            sampling_params=sampling_params,
            kv_transfer_params=dict(params, first_token_ids=first_token_ids),
        )
        if not self._route_to(decode, [request]):
            self._fail_child(child_id, self.degraded_reason or f"the {decode.role} is down")
