"""PrefixAwareRequestRouter: Ray Serve's replica choice for the engine deployment, delegating to
the pure PrefixAwarePolicy (prefix_routing.py).

The ingress passes each request's prefix key as the `routing_key` keyword of the replica call, or
a replica id as `target_replica` to reach that replica alone (its /metrics asks every one);
the queue lengths are the ones Ray's router already tracks per replica (sent minus finished,
refreshed by its probes). The policy's pick is the first rank; the other replicas form the second,
so a pick that rejects the request (at max_ongoing_requests) falls back to the least loaded.
"""

from __future__ import annotations

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

# Through the module, never `from ... import COUNTER`: Ray cloudpickles this class by value, and
# a counter captured as a global would be a private copy that /metrics never shows. Modules
# always travel by name.
from ladle.entrypoints.cluster import replica_directory, routing_metrics
from ladle.entrypoints.cluster.prefix_routing import (
    DEFAULT_LOAD_MARGIN,
    DEFAULT_MAX_TRACKED_PREFIXES,
    PrefixAwarePolicy,
)

ROUTING_KEY_KWARG = "routing_key"
TARGET_REPLICA_KWARG = "target_replica"


class PrefixAwareRequestRouter(RequestRouter):
    """Sends a request to the replica that holds its prompt prefix, within a load margin."""

    def initialize_state(
        self,
        load_margin: int = DEFAULT_LOAD_MARGIN,
        max_tracked_prefixes: int = DEFAULT_MAX_TRACKED_PREFIXES,
    ) -> None:
        self._policy = PrefixAwarePolicy(load_margin, max_tracked_prefixes)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = None
        if pending_request is not None:
            target = pending_request.kwargs.get(TARGET_REPLICA_KWARG)
            if target is not None:  # no fallback: the caller wants that replica's answer
                return [[r for r in candidate_replicas if r.replica_id.unique_id == target]]
            key = pending_request.kwargs.get(ROUTING_KEY_KWARG)
        queue_lengths = {
            replica.replica_id: self.replica_queue_len_cache.get(replica.replica_id) or 0
            for replica in candidate_replicas
        }
        decision = self._policy.choose(key, queue_lengths)
        routing_metrics.ROUTING_DECISIONS.labels(reason=decision.reason).inc()
        chosen = [r for r in candidate_replicas if r.replica_id == decision.replica]
        others = sorted(
            (r for r in candidate_replicas if r.replica_id != decision.replica),
            key=lambda r: queue_lengths[r.replica_id],
        )
        return [chosen, others] if others else [chosen]

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        replica_directory.set_running_replica_ids([r.replica_id.unique_id for r in replicas])

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._policy.forget_replica(replica_id)
