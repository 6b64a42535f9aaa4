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
    "Requests the prefix-aware router sent to each replica, by the reason it chose that replica "
    "(prefix_hit, overloaded, new_prefix, no_prefix, fallback).",
    ["replica", "reason"],
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
