"""What the prefill attention compiles to on this GPU: for each compiled variant of the paged
attention kernel after one 4 x 2048 prefill launch, the matrix instructions in its PTX (wgmma is
Hopper's asynchronous warpgroup MMA, mma.sync the Ampere-style one), registers, spills and shared
memory. Run from the repository root with PYTHONPATH=src."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from ladle.kernels import paged_attention as module
from ladle.kernels.paged_attention import LaunchConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from attention_bench import Shape, build, time_paged  # noqa: E402

shape = Shape("prefill 4x2048", 4, 2048, 2048)
inputs = build(shape)
for config in (
    LaunchConfig(),
    LaunchConfig(block_rows=128, block_n=128, num_warps=8, num_stages=3),
):
    milliseconds = time_paged(*inputs, shape, config)
    print(f"{config}: {milliseconds * 1e3:.1f} us")
torch.cuda.synchronize()
caches = getattr(module._paged_attention_kernel, "device_caches", {})
compiled = [item for cache in caches.values() for item in cache[0].items()]
print(f"{len(compiled)} compiled variants")
for key, kernel in compiled:
    if True:
        ptx = kernel.asm.get("ptx", "")
        print(
            f"variant {str(key)[:60]}: wgmma {ptx.count('wgmma.mma_async')}, "
            f"mma.sync {ptx.count('mma.sync')}, cp.async {ptx.count('cp.async')}, "
            f"regs {getattr(kernel, 'n_regs', '?')}, spills {getattr(kernel, 'n_spills', '?')}, "
            f"shared {getattr(kernel.metadata, 'shared', '?')}"
        )
