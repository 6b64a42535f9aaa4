"""The ingress's own Prometheus counters: where the router sent requests, and why.

Ray builds the request router itself (from a class path) inside the ingress process, so there is
no constructor through which to hand it a metrics object; both sides meet at this module's
registry instead, which the ingress renders at the top of its /metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

REGISTRY = CollectorRegistry()

ROUTED_REQUESTS = Counter(
    "ladle_router_requests",
    "Requests each engine replica answered (label: Ray's replica id; a retried request counts "
    "where it was answered).",
    ["replica"],
    registry=REGISTRY,
)
ROUTING_DECISIONS = Counter(
    "ladle_router_decisions",
    "Prefix-aware routing decisions by reason: prefix_hit (the replica holding the prefix), "
    "overloaded (it was busier than the least loaded by more than the margin), new_prefix, "
    "no_prefix (prompt shorter than one block).",
    ["reason"],
    registry=REGISTRY,
)
RETRIED_REQUESTS = Counter(
    "ladle_router_retried_requests",
    "Requests sent again to another replica because theirs failed before answering.",
    registry=REGISTRY,
)
CUT_STREAMS = Counter(
    "ladle_router_cut_streams",
    "Streams that ended with an error event because their replica failed mid-answer.",
    registry=REGISTRY,
)


def render_routing_metrics() -> bytes:
    return generate_latest(REGISTRY)
