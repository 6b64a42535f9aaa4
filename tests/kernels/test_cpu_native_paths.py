"""The C kernels' other vector paths (kernels/cpu_native/simd_level.h) against the same torch
references, on any x86-64 machine: the kernel tests run again in a subprocess whose library is
built for another target (LADLE_CPU_KERNELS_MARCH), which prints and checks the path it took.
Why: each build compiles one path, so the tests of this machine's own build leave the others
unrun; an AVX-512 machine's CI once passed while the AVX2 path was plain C (issue 32)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from ladle.kernels.cpu_native.build import MARCH_ENV, native_library

pytestmark = [
    pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 -march levels"),
    pytest.mark.skipif(native_library() is None, reason="no C compiler here"),
]

REPOSITORY = Path(__file__).resolve().parents[2]
KERNEL_TESTS = [
    "tests/kernels/test_cpu_native_gemv.py",
    "tests/kernels/test_cpu_native_ops.py",
    "tests/kernels/test_cpu_native_q4_int8.py",
    "tests/kernels/test_cpu_native_q8_int8.py",
]
_SCRIPT = """
import sys

import pytest

from ladle.kernels.cpu_native.build import kernels_path

print(f"path: {kernels_path()}", flush=True)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as file:
        return next((set(line.split()) for line in file if line.startswith("flags")), set())


# target flags -> the path its build must take
TARGETS = {
    "x86-64-v3": "avx2",
    # AVX-VNNI's 256-bit vpdpbusd, here in its EVEX form (simd_level.h)
    "x86-64-v3 -mavx512vl -mavx512vnni": "avx2-vnni",
    "x86-64": "plain-c",
}


@pytest.mark.slow  # each build's run of the kernel tests takes 25-65 s on 2 cores
@pytest.mark.parametrize("target", list(TARGETS))
def test_kernel_paths_match_the_references(target):
    if "vnni" in target and not {"avx512_vnni", "avx512vl"} <= _cpu_flags():
        pytest.skip("this CPU cannot run the 256-bit VNNI path (no AVX-512 VNNI or AVX-VNNI)")
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *KERNEL_TESTS], cwd=REPOSITORY,
        env={**os.environ, MARCH_ENV: target}, capture_output=True, text=True, timeout=900,
        check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    print(output[-2000:])
    assert f"path: {TARGETS[target]}\n" in output, output[-3000:]
    assert result.returncode == 0 and " passed" in output, output[-3000:]
