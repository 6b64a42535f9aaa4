"""Round-robin replica choice: each request to the next replica in turn, blind to prefixes and
load. The baseline prefix-aware routing is measured against (`--routing round-robin`; the
hit-rate figures in docs/benchmarks.md), and what many HTTP load balancers do."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from ladle.entrypoints.cluster.prefix_routing import RoutingDecision

REASON_ROUND_ROBIN = "round_robin"
# `--routing` / build_app(routing=...): "prefix" is PrefixAwarePolicy (prefix_routing.py).
ROUTING_POLICIES = ("prefix", "round-robin")


class RoundRobinPolicy:
    """Same interface as PrefixAwarePolicy: choose(key, queue_lengths) -> RoutingDecision."""

    def __init__(self) -> None:
        self._num_chosen = 0

    def choose(self, key: int | None, queue_lengths: Mapping[Hashable, int]) -> RoutingDecision:
        if not queue_lengths:
            raise ValueError("no replica to route to")
        replicas = sorted(queue_lengths, key=str)  # a stable order while the set is unchanged
        replica = replicas[self._num_chosen % len(replicas)]
        self._num_chosen += 1
        return RoutingDecision(replica, REASON_ROUND_ROBIN)

    def forget_replica(self, replica: Hashable) -> None:
        """Nothing is remembered per replica."""
