"""PrefixAwareRequestRouter: Ray Serve's replica choice for the engine deployment, delegating to
the pure PrefixAwarePolicy (prefix_routing.py).

The ingress passes each request's prefix key as the `routing_key` keyword of the replica call, or
a replica id as `target_replica` to reach that replica alone (its /metrics asks every one);
the queue lengths are this router's own count of requests in flight per replica (sent minus
completed, both told by Ray), exact and never stale. (Ray's replica_queue_len_cache forgets an
entry 10 s after its last probe, and this router never probes: reading a forgotten entry as 0
sent every request to one replica, 140 in flight against 37, in the first 2-GPU run.) The policy's
pick is the first rank; the other replicas form the second, so a pick that rejects the request
(at max_ongoing_requests) falls back to the least loaded.
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
from ladle.entrypoints.cluster.round_robin import ROUTING_POLICIES, RoundRobinPolicy

ROUTING_KEY_KWARG = "routing_key"
TARGET_REPLICA_KWARG = "target_replica"


class PrefixAwareRequestRouter(RequestRouter):
    """Sends a request to the replica that holds its prompt prefix, within a load margin (or, with
    policy="round-robin", to each replica in turn)."""

    def initialize_state(
        self,
        load_margin: int = DEFAULT_LOAD_MARGIN,
        max_tracked_prefixes: int = DEFAULT_MAX_TRACKED_PREFIXES,
        policy: str = "prefix",
    ) -> None:
        if policy not in ROUTING_POLICIES:
            raise ValueError(f"routing must be one of {ROUTING_POLICIES}, got {policy!r}")
        self._num_in_flight: dict[ReplicaID, int] = {}
        self._policy: PrefixAwarePolicy | RoundRobinPolicy = (
            RoundRobinPolicy()
            if policy == "round-robin"
            else PrefixAwarePolicy(load_margin, max_tracked_prefixes)
        )

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
            replica.replica_id: self._num_in_flight.get(replica.replica_id, 0)
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

    def on_send_request(self, replica_id: ReplicaID) -> None:
        super().on_send_request(replica_id)
        self._num_in_flight[replica_id] = self._num_in_flight.get(replica_id, 0) + 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        if self._num_in_flight.get(replica_id, 0) > 0:
            self._num_in_flight[replica_id] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._policy.forget_replica(replica_id)
        self._num_in_flight.pop(replica_id, None)
