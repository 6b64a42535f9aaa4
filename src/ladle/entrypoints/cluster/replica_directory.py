"""The engine replicas the router currently routes to, by Ray replica id: the request router
(which Ray keeps up to date) writes it, the ingress's /metrics reads it to ask each replica for its
own metrics. A module both sides import by name (see request_router.py for why)."""

from __future__ import annotations

_running_replica_ids: tuple[str, ...] = ()


def set_running_replica_ids(replica_ids: list[str]) -> None:
    global _running_replica_ids
    _running_replica_ids = tuple(sorted(replica_ids))


def running_replica_ids() -> tuple[str, ...]:
    return _running_replica_ids
