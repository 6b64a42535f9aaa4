"""EngineInstance: one engine process of a multi-engine front (xPyD disaggregation, local
replicas), started, watched and restarted as a single server's engine is, but whose outputs
and death go to the router that owns it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from ladle.frontend.client import AsyncEngineClient, EngineDeadError
from ladle.frontend.restart_policy import RestartPolicy
from ladle.kv_transfer.shm import remove_exported_pools
from ladle.protocol import wire

if TYPE_CHECKING:
    from ladle.frontend.disagg_client import DisaggregatedClient


class EngineInstance(AsyncEngineClient):
    """role: its name in logs and /metrics ("prefill 0", "decode 1", "replica 0"); kind: what
    it does ("prefill", "decode", "replica")."""

    def __init__(self, role: str, router: DisaggregatedClient, options: dict,
                 restart_policy: RestartPolicy | None, on_fatal: Callable[[str], None] | None,
                 kind: str = "replica"):
        super().__init__(options, router.metrics, router.admission,
                         startup_timeout_s=router.startup_timeout_s,
                         restart_policy=restart_policy, on_fatal=on_fatal)
        self.role = role
        self.kind = kind
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
