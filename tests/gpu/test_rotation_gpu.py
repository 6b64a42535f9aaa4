"""`ladle quantize --rotate` on a machine with CUDA: calibration (and the rotation) run on the
GPU, and the rotated int4 folder, untied head and all, serves on CUDA with the logits it has on
the CPU and an error against the float model no worse than the unrotated folder's."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tiny_models import folder_logits

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def _relative(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).norm() / expected.norm()).item()


def test_rotated_int4_folder_calibrated_on_cuda(tmp_path):
    from helpers.tiny_models import save_gemm_aligned_tiny_model, write_calibration_text

    from ladle.cli.main import main

    float_dir = save_gemm_aligned_tiny_model(tmp_path, tie_word_embeddings=True)
    text = write_calibration_text(tmp_path)
    folders = {}
    for name, extra in (("plain", []), ("rotated", ["--rotate"])):
        folders[name] = str(tmp_path / name)
        argv = ["quantize", float_dir, folders[name], "--method", "int4"]
        argv += ["--algorithm", "awq-gptq", "--calibration-data", str(text)]
        argv += ["--calibration-samples", "3", "--calibration-tokens", "40", *extra]
        assert main(argv) == 0
    assert (
        json.loads((tmp_path / "rotated" / "config.json").read_text())["tie_word_embeddings"]
        is False
    )

    reference = folder_logits(float_dir, CUDA, torch.bfloat16)
    errors = {
        name: _relative(folder_logits(f, CUDA, torch.bfloat16), reference)
        for name, f in folders.items()
    }
    assert errors["rotated"] < 2 * errors["plain"] + 0.05, errors
    on_cpu = folder_logits(folders["rotated"], CPU, torch.float32)
    assert _relative(folder_logits(folders["rotated"], CUDA, torch.bfloat16), on_cpu) < 0.03
