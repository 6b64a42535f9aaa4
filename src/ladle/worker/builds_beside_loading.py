"""Start-up's Triton build pass run beside the weights' load instead of after it.

The build pass (Worker._build_kernel_variants, kernels/parallel_builds.py) needs the model's
modules and shapes, not its weights: its dry forward passes only submit each kernel variant's
build to a thread pool. So where the modules are final before the weights arrive (load_model's
while_loading: dummy weights or a float safetensors folder, no quantization after), the worker
adopts the built model, submits the builds, and the weights are created or read while the pool
builds; leaving waits for the builds. A cold start of an 8B model builds for seconds and reads
16 GB for seconds: side by side, the shorter one disappears.

Left in its old place (after the load, the drafter, fp8 KV calibration and the MoE tile tuning)
where one of those would change what the pass builds: a draft model (its kernels are part of the
step), an fp8 KV cache (calibrated by real steps first), experts (tuned tiles), and where
LADLE_BUILDS_BESIDE_LOADING=0 says so.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from ladle.attention.kv_quant import FP8_KV_DTYPE
from ladle.kernels.parallel_builds import builds_only
from ladle.model.arch_config import ModelArchConfig
from ladle.model.layers.moe_fp8 import has_experts

if TYPE_CHECKING:
    from ladle.worker.worker import Worker


def may_build_beside_loading(worker: Worker, model: nn.Module) -> bool:
    """Whether the build pass may run before the weights (see the module docstring)."""
    speculative = worker.config.scheduler.speculative
    return (
        worker.device.type == "cuda"
        and os.environ.get("LADLE_BUILDS_BESIDE_LOADING", "1") != "0"
        and not (speculative is not None and speculative.uses_model_drafts)
        and worker.kv_cache_dtype != FP8_KV_DTYPE
        and not has_experts(model)
    )


@contextlib.contextmanager
def builds_beside_loading(
    worker: Worker, model: nn.Module, arch_config: ModelArchConfig
) -> Iterator[None]:
    """load_model's while_loading for the worker: adopt the model, submit the build pass, let
    the weights load, then wait for the builds. Records the builds' own time (submitting plus
    the wait after the load) as the "kernel builds" phase and in worker.builds_beside_load_s."""
    if not may_build_beside_loading(worker, model):
        yield
        return
    worker.adopt_model(model, arch_config)
    started = time.perf_counter()
    with builds_only() as active:
        if active:
            worker.submit_kernel_builds()
        submitted = time.perf_counter()
        yield
        loaded = time.perf_counter()
    torch.cuda.synchronize(worker.device)
    seconds = (submitted - started) + (time.perf_counter() - loaded)
    worker.built_beside_loading = active
    worker.builds_beside_load_s = seconds
    worker.startup.add("kernel builds", seconds)
