"""The int8 x int8 path (--quantization int8: cpu_int8_gemm.py) as a machine without AVX-512
VNNI runs it, on any x86-64 machine: the tests that hold the int8 model close to float run again
in a subprocess whose fbgemm is held to its AVX2 kernels (FBGEMM_ENABLE_INSTRUCTIONS=AVX2, so
activations keep 7 bits) and whose C kernels are built for x86-64-v3 (AVX2), and it prints and
checks the paths it took. Why: these tests passed only where CI ran them, on AVX-512 VNNI, and
failed on a user's AVX2 machine (issue 32)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from ladle.kernels.cpu_native.build import MARCH_ENV, native_library
from ladle.model.layers.cpu_int8_gemm import FBGEMM_ISA_ENV, quantized_engine_available

pytestmark = [
    pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 instruction sets"),
    pytest.mark.skipif(not quantized_engine_available(), reason="no CPU quantized engine"),
    pytest.mark.skipif(native_library() is None, reason="no C compiler here"),
]

REPOSITORY = Path(__file__).resolve().parents[2]
_SCRIPT = """
import sys

import pytest

from ladle.kernels.cpu_native.build import kernels_path
from ladle.model.layers.cpu_int8_gemm import engine_has_vnni

print(f"paths: C kernels {kernels_path()}, int8 engine VNNI {engine_has_vnni()}", flush=True)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
"""
QUICK = [
    "tests/model/test_group_quant.py::test_int8_model_quantization_keeps_embedding_rows_and_packs_matmuls",
    "tests/model/test_group_quant.py::test_int8_engine_matmul_is_close_to_per_token_quantized_reference",
    "tests/model/test_group_quant.py::test_outlier_channels_are_multiplied_in_float_and_keep_small_channels_accurate",
    "tests/model/test_quantized_linear.py::test_quantize_model_replaces_weights_and_keeps_outputs_close",
]  # fmt: skip
DEFAULT_MODEL = ["tests/model/test_gguf.py::test_int8_default_model_stays_close_to_hf_float32"]


def _run_on_avx2(tests: list[str]) -> None:
    environment = {**os.environ, FBGEMM_ISA_ENV: "AVX2", MARCH_ENV: "x86-64-v3"}
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *tests], cwd=REPOSITORY, env=environment,
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    print(output[-3000:])
    assert "paths: C kernels avx2, int8 engine VNNI False" in output, output[-3000:]
    assert result.returncode == 0 and " passed" in output, output[-3000:]


def test_int8_layers_stay_close_to_float_on_the_avx2_kernels():
    _run_on_avx2(QUICK)


@pytest.mark.slow  # loads the Hugging Face reference model (~45 s)
def test_int8_default_model_stays_close_to_hf_on_the_avx2_kernels():
    _run_on_avx2(DEFAULT_MODEL)
