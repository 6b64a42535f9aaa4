"""Counting Triton compilations, to prove (and tell the user) that serving compiles nothing.

Triton builds a kernel variant the first time a launch needs one: a new constexpr value, or a
new specialisation of a plain argument (an int equal to 1 or divisible by 16, a pointer aligned
to 16 bytes). Building takes from tens of milliseconds (found in Triton's on-disk cache) to
seconds (compiled), in series with the GPU. The engine's kernels keep per-step values out of
their specialisation keys and its warm-up runs every remaining variant at start-up; this log is
how start-up reports what it built and how a test pins that a later run builds nothing.

It hooks triton.knobs.runtime.jit_cache_hook (called before a build) and jit_post_compile_hook
(after), chaining any hooks already installed. Process-wide by nature: Triton's kernel caches
are. Where Triton is missing (the CPU path) or lacks the hooks, it counts nothing and says so.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field


@dataclass
class CompileTotals:
    """Kernel variants built so far in this process and the seconds spent building them."""

    num_builds: int = 0
    num_disk_hits: int = 0  # builds that found their binary in Triton's on-disk cache
    seconds: float = 0.0
    names: list[str] = field(default_factory=list)

    def since(self, earlier: CompileTotals) -> CompileTotals:
        return CompileTotals(
            num_builds=self.num_builds - earlier.num_builds,
            num_disk_hits=self.num_disk_hits - earlier.num_disk_hits,
            seconds=self.seconds - earlier.seconds,
            names=self.names[len(earlier.names) :],
        )

    def describe(self) -> str:
        return (
            f"{self.num_builds} Triton kernel variants built in {self.seconds:.1f} s "
            f"({self.num_disk_hits} from the disk cache {triton_cache_dir()})"
        )


class _CompileLog:
    def __init__(self) -> None:
        self.totals = CompileTotals()
        self.is_installed = False
        self._started: dict[str, float] = {}

    def install(self) -> bool:
        if self.is_installed:
            return True
        try:
            from triton import knobs
        except ImportError:
            return False
        runtime = getattr(knobs, "runtime", None)
        if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
            return False
        previous_pre = runtime.jit_cache_hook
        previous_post = runtime.jit_post_compile_hook

        def before_build(*args, **kwargs):
            self._started[str(kwargs.get("key"))] = time.perf_counter()
            # A truthy answer would tell Triton to skip the build: pass the earlier hook's on.
            return previous_pre(*args, **kwargs) if previous_pre else None

        def after_build(*args, **kwargs):
            started = self._started.pop(str(kwargs.get("key")), None)
            self.totals.num_builds += 1
            if started is not None:
                self.totals.seconds += time.perf_counter() - started
            function = kwargs.get("fn")
            self.totals.names.append(getattr(function, "name", "?"))
            return previous_post(*args, **kwargs) if previous_post else None

        runtime.jit_cache_hook = before_build
        runtime.jit_post_compile_hook = after_build
        compilation = getattr(knobs, "compilation", None)
        if compilation is not None and hasattr(compilation, "listener"):
            previous_listener = compilation.listener

            def on_compiled(*args, **kwargs):
                if kwargs.get("cache_hit"):
                    self.totals.num_disk_hits += 1
                if previous_listener:
                    previous_listener(*args, **kwargs)

            compilation.listener = on_compiled
        self.is_installed = True
        return True


_LOG = _CompileLog()


def start_compile_log() -> bool:
    """Start counting (idempotent); False where Triton or its hooks are missing."""
    return _LOG.install()


def compile_totals() -> CompileTotals | None:
    """A snapshot of the builds counted so far, or None when nothing is being counted."""
    if not _LOG.is_installed:
        return None
    totals = _LOG.totals
    return CompileTotals(
        totals.num_builds, totals.num_disk_hits, totals.seconds, list(totals.names)
    )


def triton_cache_dir() -> str:
    """Where Triton keeps compiled kernels between processes (TRITON_CACHE_DIR overrides)."""
    try:
        from triton import knobs

        directory = knobs.cache.dir
        if directory:
            return str(directory)
    except (ImportError, AttributeError):
        pass
    return os.environ.get("TRITON_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".triton", "cache"
    )
