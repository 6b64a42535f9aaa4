"""LocalReplicasClient: N aggregated engine replicas behind one API process (no Ray).

`ladle serve MODEL --local-replicas 2` runs two ordinary engines (one GPU each on CUDA) and
sends each request to the one with fewer requests open; it is the aggregated side of
`ladle bench serve --compare-disaggregation`, behind the same front as `--disaggregate 1P1D`.
(`--replicas N` runs replicas on Ray Serve, across hosts.) A dead replica fails its own
requests with the reason, is restarted under the restart policy, and the other keeps serving.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ladle.frontend.admission import AdmissionController
from ladle.frontend.client import AsyncEngineClient, EngineDeadError, EngineInfo
from ladle.frontend.engine_instance import EngineInstance
from ladle.frontend.metrics import ServerMetrics
from ladle.frontend.restart_policy import RestartPolicy
from ladle.protocol import wire
from ladle.protocol.messages import SchedulerStats


class LocalReplicasClient(AsyncEngineClient):
    """The API process's handle on N engine replicas; requests go to the least loaded."""

    def __init__(
        self,
        engine_options: dict,
        metrics: ServerMetrics,
        admission: AdmissionController,
        num_replicas: int,
        startup_timeout_s: float = 1800.0,
        restart_policy: RestartPolicy | None = None,
        on_fatal: Callable[[str], None] | None = None,
        devices: list[str] | None = None,
    ) -> None:
        super().__init__(engine_options, metrics, admission, startup_timeout_s, restart_policy,
                         on_fatal)
        self.instances: list[EngineInstance] = []
        for index in range(num_replicas):
            options = dict(engine_options)
            if devices is not None:
                options["device"] = devices[index]
            self.instances.append(
                EngineInstance(f"replica {index}", self, options, restart_policy, on_fatal)
            )
        self._replica_of: dict[str, EngineInstance] = {}  # core request id -> its replica
        self.instance_stats: dict[str, SchedulerStats] = {}

    @property
    def engine_pid(self) -> int | None:
        return self.instances[0].engine_pid

    async def start(self) -> None:
        for instance in self.instances:  # one at a time: tokenizer loads race in transformers
            await instance.start()
        first = self.instances[0]
        self.tokenizer = first.tokenizer
        self.info = EngineInfo(
            max_model_len=min(i.info.max_model_len for i in self.instances),
            memory_budget="; ".join(i.info.memory_budget for i in self.instances),
            vocab_size=first.info.vocab_size,
        )
        self.sampling_defaults = dict(first.sampling_defaults)
        self.output_processor = first.output_processor
        self.dead_reason = None
        pids = ", ".join(str(i.engine_pid) for i in self.instances)
        print(f"[ladle] {len(self.instances)} local replicas in processes {pids}", flush=True)

    def begin_shutdown(self) -> None:
        self._is_stopping = True
        for instance in self.instances:
            instance.begin_shutdown()

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        if self._shutting_down:
            return
        self._shutting_down = self._is_stopping = True
        for instance in self.instances:
            await instance.shutdown(timeout_s)
        error = EngineDeadError("the server is shutting down")
        for request_id, buffer in list(self._buffers.items()):
            buffer.fail(error)
            self._forget(request_id)

    def _on_instance_live(self, instance: EngineInstance) -> None:
        if self.info is not None and all(i.is_alive for i in self.instances):
            self.dead_reason = None

    def _on_instance_dead(self, instance: EngineInstance, reason: str) -> None:
        if self._shutting_down:
            return
        if not any(i.is_alive for i in self.instances):
            self.dead_reason = f"every replica is down ({reason})"
        self.metrics.record_engine_dead()
        for child_id, replica in list(self._replica_of.items()):
            if replica is instance:
                parent_id = self._parent_of.get(child_id)
                buffer = self._buffers.get(parent_id) if parent_id is not None else None
                if buffer is not None:
                    self.abort(parent_id)
                    buffer.fail(EngineDeadError(f"its {instance.role} died ({reason})"))
                self._replica_of.pop(child_id, None)

    def _send(self, message: wire.EngineInput) -> None:
        if isinstance(message, wire.AddRequests):
            live = [i for i in self.instances if i.is_alive]
            if not live:
                raise EngineDeadError(self.dead_reason or "every replica is down")
            load = {id(i): 0 for i in live}
            for replica in self._replica_of.values():
                if id(replica) in load:
                    load[id(replica)] += 1
            target = min(live, key=lambda i: load[id(i)])
            if not target.send(message):
                raise EngineDeadError(f"{target.role} is down")
            for request in message.requests:
                self._replica_of[request.request_id] = target
        elif isinstance(message, wire.AbortRequests):
            for request_id in message.request_ids:
                self._replica_of.pop(request_id, None)
            for instance in self.instances:
                instance.send(message)
        else:
            for instance in self.instances:
                instance.send(message)

    def _forget(self, request_id: str) -> None:
        for child_id in self._children.get(request_id, ()):
            self._replica_of.pop(child_id, None)
        super()._forget(request_id)

    def _on_step(self, instance: EngineInstance, step: wire.EngineStep) -> None:
        if self.output_processor is None:
            return
        stats = None
        if step.stats is not None:
            self.instance_stats[instance.role] = step.stats
            stats = _summed(list(self.instance_stats.values()))
        super()._apply_step(wire.EngineStep(step.outputs, step.rejections, stats))


def _summed(all_stats: list[SchedulerStats]) -> SchedulerStats:
    """The first replica's stats with the requests and KV pools of all of them."""
    free = sum(s.num_free_blocks for s in all_stats)
    total = sum(s.num_total_blocks for s in all_stats)
    return dataclasses.replace(
        all_stats[0],
        num_running_reqs=sum(s.num_running_reqs for s in all_stats),
        num_waiting_reqs=sum(s.num_waiting_reqs for s in all_stats),
        num_free_blocks=free,
        num_total_blocks=total,
        kv_cache_usage=1.0 - free / total if total else 0.0,
    )
