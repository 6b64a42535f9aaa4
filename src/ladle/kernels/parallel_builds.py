"""Building Triton kernel variants on a thread pool before the first step that needs them.

A cold start of an 8B model built ~17 variants one after another (~0.5 s each, 8.6 s of a
26.7 s start-up), each the first time a launch needed it. Triton can build on an executor
(`triton.AsyncCompileMode`): a launch made with warmup=True then only submits the build. Inside
`builds_only()` every Triton launch is turned into such a submission (nothing runs on the GPU
for Triton kernels; torch ops still run, on whatever the unlaunched kernels left in memory),
so one dry forward pass submits every variant it meets and leaving the block waits for all of
them. The LLVM step and ptxas release the GIL, so the builds overlap.

Only safe for code whose host side does not depend on values a Triton kernel would have
written (a forward pass through the layers: yes; the sampler, whose sampled ids index other
tensors: no). LADLE_PARALLEL_TRITON_BUILDS=0 turns it off (builds then happen on first use,
one at a time, as before).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

_MAX_WORKERS = 8


def parallel_builds_enabled() -> bool:
    return os.environ.get("LADLE_PARALLEL_TRITON_BUILDS", "1") != "0"


@contextlib.contextmanager
def builds_only(max_workers: int | None = None) -> Iterator[bool]:
    """Within: Triton launches only submit their builds to a thread pool; on leaving, every
    build has finished and sits in its kernel's cache. Yields False (and changes nothing)
    where Triton or its async mode is missing, or the environment turned it off."""
    try:
        import triton
        from triton.runtime.jit import JITFunction
    except ImportError:
        yield False
        return
    async_mode = getattr(triton, "AsyncCompileMode", None)
    if async_mode is None or not parallel_builds_enabled():
        yield False
        return
    workers = max_workers or min(_MAX_WORKERS, os.cpu_count() or 1)
    original_run = JITFunction.run

    def submit_build(self, *args, grid, warmup, **kwargs):
        return original_run(self, *args, grid=grid, warmup=True, **kwargs)

    with ThreadPoolExecutor(workers, thread_name_prefix="triton-build") as pool:
        # The async mode's exit waits for the builds: it must run after the launches are
        # restored, and before the pool shuts down.
        with async_mode(pool) as mode:
            JITFunction.run = submit_build
            try:
                yield True
            finally:
                JITFunction.run = original_run
    # Load each built binary onto the device now: a first launch does it otherwise, and a
    # first launch inside a CUDA graph capture must not load a module.
    for built in mode.future_kernels.values():
        if built.kernel is not None:
            built.kernel._init_handles()


class TritonBuildNeeded(RuntimeError):
    """A Triton launch inside `no_builds()` needed a kernel variant that is not built yet."""


@contextlib.contextmanager
def no_builds() -> Iterator[None]:
    """Within: a Triton launch that would build a variant raises TritonBuildNeeded before it
    builds (a CUDA graph capture uses this: a build cannot happen inside a capture, so the
    capture is abandoned and redone after an eager run has built the variant)."""
    try:
        from triton import knobs
    except ImportError:
        yield
        return
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_cache_hook"):
        yield
        return
    previous = runtime.jit_cache_hook

    def refuse(*args, **kwargs):
        raise TritonBuildNeeded(str(kwargs.get("fn", "a Triton kernel")))

    runtime.jit_cache_hook = refuse
    try:
        yield
    finally:
        runtime.jit_cache_hook = previous
