"""The CPU's C kernels built on a thread from the worker's start (build_in_background): a
second caller waits for that build rather than starting another, and gets the same library."""

from __future__ import annotations

import shutil
import threading
import time

import pytest

from ladle.kernels.cpu_native import build


def test_background_build_and_first_use_build_once(tmp_path, monkeypatch):
    library = build.native_library()
    if library is None:
        pytest.skip("the C kernels are unavailable here (no compiler, or turned off)")
    built_path = library._name
    monkeypatch.setenv("LADLE_CACHE_DIR", str(tmp_path))  # an empty cache: a build is needed
    builds: list[str] = []

    def slow_copy(compiler, sources, target):  # the real build's seconds, without a compiler
        builds.append(threading.current_thread().name)
        time.sleep(0.3)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built_path, target)

    monkeypatch.setattr(build, "_build", slow_copy)
    build._load_library.cache_clear()
    try:
        build.build_in_background()
        time.sleep(0.05)  # the thread is inside its build
        assert build.native_library() is not None
        assert builds == ["ladle-cpu-kernels"]
        assert build.native_library() is not None and len(builds) == 1
        build.build_in_background()  # loaded: no second thread, no second build
        time.sleep(0.05)
        assert len(builds) == 1
    finally:
        monkeypatch.undo()
        build._load_library.cache_clear()  # later tests load the real cache's library again
