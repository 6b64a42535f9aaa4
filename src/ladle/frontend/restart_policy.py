"""When the API process may start a new engine-core process after one died.

A bounded number of restarts within a sliding window: an engine that dies now and then (killed,
out of memory once) is replaced and the server heals; one that keeps dying (a bad GPU, a model
that cannot load any more) is not restarted forever, the server exits non-zero instead so a
supervisor (systemd, Kubernetes) sees the failure and replaces the whole pod.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    """enabled: restart at all. max_restarts within window_s seconds, then give up."""

    enabled: bool = True
    max_restarts: int = 3
    window_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {self.window_s}")


class RestartBudget:
    """Remembers recent restarts; may_restart() says whether one more fits the policy."""

    def __init__(self, policy: RestartPolicy, clock: Callable[[], float] = time.monotonic):
        self.policy = policy
        self._clock = clock
        self._restart_times: collections.deque[float] = collections.deque()

    def may_restart(self) -> bool:
        if not self.policy.enabled:
            return False
        now = self._clock()
        while self._restart_times and self._restart_times[0] <= now - self.policy.window_s:
            self._restart_times.popleft()
        return len(self._restart_times) < self.policy.max_restarts

    def record_restart(self) -> None:
        self._restart_times.append(self._clock())

    def describe(self) -> str:
        return (f"{self.policy.max_restarts} restarts within {self.policy.window_s:.0f}s"
                if self.policy.enabled else "restarts are off")
