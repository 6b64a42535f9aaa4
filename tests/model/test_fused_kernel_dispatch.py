"""The CPU path of the layers and the sampler never touches the fused Triton kernels."""

from __future__ import annotations

import subprocess
import sys

import torch

from ladle.kernels.dispatch import set_fused_kernels, use_fused_kernels


def test_fused_kernels_are_only_used_on_cuda():
    previous = set_fused_kernels(True)
    try:
        assert not use_fused_kernels(torch.zeros(1))
        set_fused_kernels(False)
        assert not use_fused_kernels(torch.zeros(1))
    finally:
        set_fused_kernels(previous)


def test_cpu_forward_imports_no_kernel_module():
    """Run the layers and the sampler on the CPU in a fresh process: no Triton kernel module
    (nor triton itself) may be imported on that path; the CPU's C kernels (ladle.kernels.
    cpu_native, ctypes) may."""
    code = """
import sys, torch
from ladle.model.layers.norm import RMSNorm
from ladle.model.layers.rotary import RotaryEmbedding
from ladle.model.layers.activation import SiluAndMul
from ladle import SamplingParams
from ladle.sample.metadata import build_sampling_metadata
from ladle.sample.sampler import Sampler
norm = RMSNorm(8); norm.weight.data.fill_(1.0)
x = torch.randn(3, 8)
norm(x); norm(x, torch.randn(3, 8))
RotaryEmbedding(8, 16, 1e4)(torch.arange(3), torch.randn(3, 2, 8), torch.randn(3, 1, 8))
SiluAndMul()(torch.randn(3, 8))
metadata = build_sampling_metadata(
    [SamplingParams(temperature=0.7, top_k=3, seed=1)], seeds=[1], num_output_tokens=[0],
    vocab_size=10)
Sampler()(torch.randn(1, 10), metadata)
loaded = [m for m in sys.modules if m == "triton" or m.startswith("ladle.kernels.")]
loaded = [m for m in loaded if not m.startswith("ladle.kernels.cpu_native")]
assert loaded == ["ladle.kernels.dispatch"], loaded
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
