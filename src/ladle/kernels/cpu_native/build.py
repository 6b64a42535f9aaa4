"""Build and load ladle's C kernels for the CPU (the .c files beside this module).

They are compiled once per machine by the system's C compiler (`cc`, or $CC) with
`-O3 -march=native -fopenmp`, into ladle's cache (`~/.cache/ladle/cpu_kernels/`, or
$LADLE_CACHE_DIR/cpu_kernels/), keyed by a hash of the sources, the flags and the compiler, so
a changed source or another CPU's cache never loads a stale library. A build takes about a
second; later processes load the cached library. Loaded through ctypes, they need no torch
headers (a torch C++ extension takes ~a minute to compile).

Where there is no compiler, the build fails, or LADLE_CPU_KERNELS=0 is set, `native_library()`
returns None after one log line, and every caller keeps its torch path.

Threads: the decode GEMVs share their rows out through thread_pool.c, whose caller never waits
for a helper thread that is not running (an OpenMP team does, at its closing barrier, which on a
busy machine costs a time slice per call); they use `kernel_threads()`, all usable cores unless
OMP_NUM_THREADS says fewer, even while ladle's thread governor (ladle/threads.py) has shrunk
torch's team. The rest use OpenMP: the library links libgomp.so.1, which resolves to the copy
torch has already loaded, so theirs is torch's own team.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

DISABLE_ENV = "LADLE_CPU_KERNELS"
SOURCES = (
    "simd_level.c", "thread_pool.c", "int8_gemv.c", "group_gemv.c", "rms_norm.c", "silu_and_mul.c",
    "rotary_cache.c", "decode_attention.c", "q4_int8_gemm.c", "decode_stack.c",
)  # fmt: skip
HEADERS = (
    "half_float.h", "thread_pool.h", "fast_exp.h", "decode_kernels.h", "vector_sum.h",
    "simd_level.h", "interleaved_avx2.h",
)  # fmt: skip
FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c11")
# The target CPU: native by default; tests set another (x86-64-v3: AVX2, x86-64: plain C) to
# check the kernels' other paths (simd_level.h) against the same references. Words after the
# first are further compiler flags: "x86-64-v3 -mavx512vl -mavx512vnni" builds the AVX2 path with
# the 256-bit VNNI dot product, which AVX-VNNI CPUs run, on a machine with AVX-512 VNNI.
MARCH_ENV = "LADLE_CPU_KERNELS_MARCH"
BUILD_TIMEOUT_S = 120


def _log(message: str) -> None:
    print(f"[ladle] {message}", file=sys.stderr, flush=True)


def _compiler() -> str | None:
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    return None


def _cache_dir() -> Path:
    from ladle.model.default_model import default_cache_dir

    return default_cache_dir() / "cpu_kernels"


def _library_name(compiler: str, sources: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.read_bytes())
    digest.update(" ".join(_flags()).encode())
    version = subprocess.run(
        [compiler, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    digest.update(version.stdout.encode())
    # -march=native: a library built on another CPU must not be picked up from a shared home.
    digest.update(_cpu_flags().encode())
    return f"libladle_cpu_{digest.hexdigest()[:16]}.so"


def _flags() -> tuple[str, ...]:
    march, *extra = os.environ.get(MARCH_ENV, "native").split() or ["native"]
    return (f"-march={march}", *extra, *FLAGS)


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as file:
            for line in file:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return ""


def _build(compiler: str, sources: list[Path], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built under a temporary name and renamed: processes starting together never load a
    # half-written library.
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        output = Path(scratch) / target.name
        command = [compiler, *_flags(), "-o", str(output), *map(str, sources), "-lm"]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()[-2000:]}")
        os.replace(output, target)


_enabled = os.environ.get(DISABLE_ENV, "1") != "0"


def set_native_kernels(enabled: bool) -> bool:
    """Turn the C kernels on or off for this process (tests compare against the torch path);
    returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, enabled
    return previous


@functools.cache
def kernel_threads() -> int:
    """Threads of the decode GEMVs' pool: the usable cores, or OMP_NUM_THREADS if set."""
    from ladle.threads import usable_cores

    requested = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, int(requested)) if requested.isdigit() else usable_cores()


def native_library() -> ctypes.CDLL | None:
    """The loaded kernel library, building it on first use; None (logged once) where it cannot
    be had or is turned off, so that callers fall back to torch."""
    if not _enabled:
        return None
    if _load_library.cache_info().currsize:  # loaded (or refused): no lock on the hot path
        return _load_library()
    with _first_load:  # one build, whichever thread asks first (build_in_background)
        return _load_library()


# Held while the library is first loaded: a second thread waits for that build, not a second.
_first_load = threading.Lock()


def build_in_background() -> None:
    """Start building (or loading) the library on a thread: the compiler runs in a subprocess,
    so a cold cache's build (seconds) overlaps the model's load instead of delaying the first
    step. Nothing happens where the kernels are off or already loaded."""
    if _enabled and not _load_library.cache_info().currsize:
        threading.Thread(target=native_library, name="ladle-cpu-kernels", daemon=True).start()


@functools.cache
def _load_library() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    compiler = _compiler()
    if compiler is None:
        _log("no C compiler found: CPU decode uses torch's kernels (slower at batch 1)")
        return None
    here = Path(__file__).parent
    sources = [here / name for name in SOURCES]
    try:
        target = _cache_dir() / _library_name(compiler, [*sources, *(here / h for h in HEADERS)])
        built = not target.exists()
        if built:
            _build(compiler, sources, target)
        library = ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.SubprocessError) as error:
        _log(f"CPU kernels unavailable, using torch's: {error}")
        return None
    _declare(library)
    if built:
        path = library.ladle_cpu_kernels_path().decode()
        _log(f"built the CPU kernels ({' '.join(_flags()[: -len(FLAGS)])}): the {path} path")
    return library


def kernels_path() -> str | None:
    """The vector path of the loaded kernels (simd_level.h): avx512-vnni, avx512, avx2-vnni,
    avx2 or plain-c; None without them."""
    library = native_library()
    return None if library is None else library.ladle_cpu_kernels_path().decode()


def _declare(library: ctypes.CDLL) -> None:
    pointer, int64 = ctypes.c_void_p, ctypes.c_int64
    library.ladle_cpu_kernels_path.restype = ctypes.c_char_p
    library.ladle_cpu_kernels_path.argtypes = []
    library.ladle_int8_gemv.restype = ctypes.c_int
    library.ladle_int8_gemv.argtypes = [
        pointer, int64, int64, pointer, pointer, pointer, pointer, int64, int64,
    ]  # fmt: skip
    library.ladle_group_gemv.restype = ctypes.c_int
    library.ladle_group_gemv.argtypes = [
        pointer, int64, int64, int64, int64, pointer, pointer, pointer, int64, pointer, pointer,
        int64, int64,
    ]  # fmt: skip
    library.ladle_q4_int8_gemm.restype = ctypes.c_int
    library.ladle_q4_int8_gemm.argtypes = [
        pointer, int64, int64, int64, pointer, pointer, pointer, int64, pointer, pointer, int64,
        int64,
    ]  # fmt: skip
    library.ladle_q8_int8_gemm.restype = ctypes.c_int
    library.ladle_q8_int8_gemm.argtypes = [
        pointer, int64, int64, int64, pointer, pointer, int64, pointer, pointer, int64, int64,
    ]  # fmt: skip
    library.ladle_q4_int8_gemm_interleaved.restype = int64
    library.ladle_q4_int8_gemm_interleaved.argtypes = []
    library.ladle_group_dequantize.restype = ctypes.c_int
    library.ladle_group_dequantize.argtypes = [
        pointer, pointer, pointer, int64, int64, int64, int64, int64, int64, pointer, int64,
    ]  # fmt: skip
    library.ladle_add_rms_norm.restype = None
    library.ladle_add_rms_norm.argtypes = [
        pointer, pointer, pointer, ctypes.c_double, pointer, int64, int64,
    ]  # fmt: skip
    library.ladle_silu_and_mul.restype = None
    library.ladle_silu_and_mul.argtypes = [pointer, pointer, int64, int64]
    library.ladle_rotary_and_cache.restype = ctypes.c_int
    library.ladle_rotary_and_cache.argtypes = [
        pointer, int64, int64, int64, int64, int64, pointer, pointer, pointer, pointer, pointer,
        int64,
    ]  # fmt: skip
    library.ladle_decode_attention.restype = ctypes.c_int
    library.ladle_decode_attention.argtypes = [
        pointer, pointer, pointer, pointer, pointer, int64, int64, int64, int64, int64,
        ctypes.c_double, pointer, int64,
    ]  # fmt: skip
    library.ladle_decode_stack_layer_fields.restype = int64
    library.ladle_decode_stack_layer_fields.argtypes = []
    library.ladle_decode_stack.restype = ctypes.c_int
    library.ladle_decode_stack.argtypes = [
        pointer, pointer, ctypes.c_double, ctypes.c_double, pointer, pointer, pointer, pointer,
        pointer, pointer, pointer, pointer, int64,
    ]  # fmt: skip
