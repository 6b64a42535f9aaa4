"""PrefixAwareRequestRouter: Ray Serve's replica choice for the engine deployment, delegating to
the pure PrefixAwarePolicy (prefix_routing.py).

The ingress passes each request's prefix key as the `routing_key` keyword of the replica call;
the queue lengths are this router's own count of the requests it assigned to each replica and
that have not completed (Ray tells it of each completion by the request's id). A request counts
from the moment it is assigned, not sent: Ray chooses for many pending requests before it sends
any, and a burst of 64 streams once all went to one replica while both counts still read 0.
(Ray's replica_queue_len_cache is no better here: it forgets an entry 10 s after the last probe,
and this router never probes.) The policy's pick is the first rank; the other replicas form the
second, so a pick that rejects the request (at max_ongoing_requests) falls back to the least
loaded.
"""

from __future__ import annotations

from collections import Counter

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

# Through the module, never `from ... import COUNTER`: Ray cloudpickles this class by value, and
# a counter captured as a global would be a private copy that /metrics never shows. Modules
# always travel by name.
from ladle.entrypoints.cluster import routing_metrics
from ladle.entrypoints.cluster.prefix_routing import (
    DEFAULT_LOAD_MARGIN,
    DEFAULT_MAX_TRACKED_PREFIXES,
    PrefixAwarePolicy,
)
from ladle.entrypoints.cluster.round_robin import ROUTING_POLICIES, RoundRobinPolicy

ROUTING_KEY_KWARG = "routing_key"


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
        # request id -> the replica it was assigned to, until Ray reports it completed
        self._assigned: dict[str, ReplicaID] = {}
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
            key = pending_request.kwargs.get(ROUTING_KEY_KWARG)
        num_assigned = Counter(self._assigned.values())
        queue_lengths = {
            replica.replica_id: num_assigned[replica.replica_id] for replica in candidate_replicas
        }
        decision = self._policy.choose(key, queue_lengths)
        if pending_request is not None:
            self._assigned[pending_request.metadata.internal_request_id] = decision.replica
        routing_metrics.ROUTING_DECISIONS.labels(reason=decision.reason).inc()
        chosen = [r for r in candidate_replicas if r.replica_id == decision.replica]
        others = sorted(
            (r for r in candidate_replicas if r.replica_id != decision.replica),
            key=lambda r: queue_lengths[r.replica_id],
        )
        return [chosen, others] if others else [chosen]

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        super().on_request_completed(replica_id, internal_request_id)
        self._assigned.pop(internal_request_id, None)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._policy.forget_replica(replica_id)
        for request_id in [r for r, replica in self._assigned.items() if replica == replica_id]:
            del self._assigned[request_id]
