"""Build the executor the parallel configuration asks for."""

from __future__ import annotations

from ladle.config import EngineConfig
from ladle.executor.base import Executor
from ladle.executor.in_process import InProcessExecutor
from ladle.executor.multiprocess import MultiprocessExecutor
from ladle.executor.ray_executor import RayExecutor


def build_executor(config: EngineConfig) -> Executor:
    """'uni': the worker in this process; 'mp': one worker process per rank; 'ray': one Ray
    actor per rank (ray itself is imported only when one starts)."""
    if config.parallel.executor_backend == "mp":
        return MultiprocessExecutor(config)
    if config.parallel.executor_backend == "ray":
        return RayExecutor(config)
    return InProcessExecutor(config)
