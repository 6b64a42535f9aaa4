"""Start-up of the fused MoE path (kernels/fused_moe.py) on a CUDA worker: tile tables tuned
(or read from the disk cache, kernels/moe_tuning.py) for each distinct expert shape of the
model, set on its MoE layers, and every chosen plan's kernel variants built, so no Triton build
happens while serving (tests/gpu/test_no_compile_while_serving.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ladle.kernels.parallel_builds import builds_only
from ladle.model.layers.moe import SparseMoeBlock


@dataclass(frozen=True)
class FusedMoeSetup:
    """What start-up did, for its log line and `ladle bench`."""

    num_layers: int
    num_shapes: int
    tuning_seconds: float
    from_cache: bool
    cache_paths: tuple[str, ...]
    plans: tuple[str, ...]  # "bucket: plan" per bucket of the first shape

    def describe(self) -> str:
        how = "read from the cache" if self.from_cache else "tuned on the device"
        where = ", ".join(self.cache_paths)
        return (
            f"fused MoE tiles for {self.num_layers} layers ({self.num_shapes} shape(s)) {how} "
            f"in {self.tuning_seconds:.1f} s ({where})"
        )


def prepare_fused_moe(
    model: nn.Module, dtype: torch.dtype, max_tokens: int
) -> FusedMoeSetup | None:
    """Tune and install the tile tables of every MoE layer that runs the fused path, then build
    every bucket's variants; None when no layer does (CPU, fused kernels off)."""
    blocks = [
        m for m in model.modules() if isinstance(m, SparseMoeBlock) and m.experts.can_run_fused()
    ]
    if not blocks:
        return None
    # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no triton;
    # tests/model/test_fused_kernel_dispatch.py).
    from ladle.kernels.moe_tuning import MoeShape, tune_tile_table

    by_shape: dict[MoeShape, list[SparseMoeBlock]] = {}
    for block in blocks:
        shape = MoeShape.of(block.experts.stacks(), block.gate.top_k, dtype)
        by_shape.setdefault(shape, []).append(block)
    seconds, from_cache, paths, plans = 0.0, True, [], []
    for same_shape in by_shape.values():
        first = same_shape[0]
        result = tune_tile_table(first.experts.stacks(), first.gate.top_k, dtype, max_tokens)
        seconds += result.seconds
        from_cache &= result.from_cache
        paths.append(str(result.path))
        for block in same_shape:
            block.experts.tile_table = result.table
        _build_plans(first, result.table.buckets, dtype)
        if not plans:
            plans = [
                f"{bucket}: {plan.gate_up.describe()} | {plan.down.describe()}"
                for bucket, plan in zip(result.table.buckets, result.table.plans, strict=True)
            ]
    return FusedMoeSetup(len(blocks), len(by_shape), seconds, from_cache, tuple(paths),
                         tuple(plans))  # fmt: skip


@torch.inference_mode()
def _build_plans(block: SparseMoeBlock, buckets: tuple[int, ...], dtype: torch.dtype) -> None:
    """Run the layer once at every bucket's token count: its routing's and its plans' variants
    (the alignment's too) are built on the build pool, then loaded onto the device. (Its counts
    of these made-up tokens are zeroed after the warm-up.)"""
    device = block.experts.gate_up_proj.device
    with builds_only():
        for num_tokens in buckets:
            block(torch.zeros(num_tokens, block.experts.hidden_size, device=device, dtype=dtype))
    torch.cuda.synchronize(device)
