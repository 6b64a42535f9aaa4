"""Which int4 kernel runs a given batch size of a given weight shape, measured once at load.

The fastest int4 launch depends on the GPU, the weight's shape and the number of token rows: the
tensor-core-free GEMV wins at a batch of one, the tl.dot kernel somewhere above, and past a few
dozen rows dequantizing the weight once and running cuBLAS wins. Rather than guess the crossover,
each distinct (shape, dtype) is timed at load for every batch bucket: each candidate is first
checked against the dequantized product (a candidate that fails to build or disagrees is dropped)
and then timed as replays of a CUDA graph, so the figure is GPU time without launch gaps, as in
the engine's captured decode. The choice is a table read at call time: no host work per call, and
nothing to decide (or build) during graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ladle.kernels.int4_decode import (
    GEMV_KERNELS,
    GEMV_MAX_TOKENS,
    MMA_KERNELS,
    Int4Kernel,
    int4_decode_matmul,
)
from ladle.kernels.int4_matmul import int4_dequantize

# Batch buckets: a call with M rows uses the choice of the smallest bucket >= M; above the last
# bucket a call always dequantizes (prefill-sized: compute-bound, cuBLAS's GEMM wins).
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEQUANTIZE = "dequantize+cublas"
MAX_RELATIVE_ERROR = 1e-2
CALLS_PER_GRAPH = 10
REPLAYS = 5


@dataclass
class Int4Plan:
    """The kernel per batch bucket (None: dequantize and run cuBLAS) and what was measured."""

    kernels: tuple[Int4Kernel | None, ...]
    timings_us: dict[int, dict[str, float]] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)

    def kernel_for(self, num_tokens: int) -> Int4Kernel | None:
        for bucket, kernel in zip(BUCKETS, self.kernels):
            if num_tokens <= bucket:
                return kernel
        return None


_plans: dict[tuple, Int4Plan] = {}


def time_in_graph_us(fn, calls: int = CALLS_PER_GRAPH, replays: int = REPLAYS) -> float:
    """Median GPU microseconds of one call of fn, from replays of a graph of `calls` calls."""
    fn()  # built and warm before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    samples = []
    for _ in range(replays):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return sorted(samples)[len(samples) // 2]


def candidates(num_tokens: int) -> list[Int4Kernel | None]:
    listed: list[Int4Kernel | None] = list(MMA_KERNELS)
    if num_tokens <= GEMV_MAX_TOKENS:
        gemv = [kernel for kernel in GEMV_KERNELS if kernel.suits(num_tokens)]
        listed = gemv + listed
    if num_tokens >= 8:
        listed.append(None)
    return listed


def _name(kernel: Int4Kernel | None) -> str:
    return DEQUANTIZE if kernel is None else str(kernel)


def measure_plan(
    packed_t: torch.Tensor,
    scale_t: torch.Tensor,
    zero_t: torch.Tensor,
    group_size: int,
    num_inputs: int,
    dtype: torch.dtype = torch.bfloat16,
) -> Int4Plan:
    """Time every candidate at every bucket and keep the fastest correct one per bucket."""

    device = packed_t.device
    args = (packed_t, scale_t, zero_t, group_size)
    # The check's reference: the dequantized weight in the activation dtype (its rounding, 2^-9,
    # is far inside MAX_RELATIVE_ERROR) and cuBLAS; no float32 copy of a large weight.
    dense_t = int4_dequantize(*args, num_inputs, dtype)
    generator = torch.Generator(device=device).manual_seed(0)  # not the global RNG
    chosen: list[Int4Kernel | None] = []
    plan = Int4Plan(kernels=())
    for bucket in BUCKETS:
        x = torch.randn(bucket, num_inputs, device=device, generator=generator).to(dtype)
        expected = (x @ dense_t).float()
        timings: dict[str, float] = {}
        for kernel in candidates(bucket):
            name = _name(kernel)
            if name in plan.rejected:
                continue
            if kernel is None:

                def call(x=x):
                    return x @ int4_dequantize(*args, num_inputs, dtype)
            else:

                def call(x=x, kernel=kernel):
                    return int4_decode_matmul(x, *args, kernel=kernel)

            try:
                actual = call().float()
                error = ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()
                if not error < MAX_RELATIVE_ERROR:
                    plan.rejected[name] = f"relative error {error:.3g} at {bucket} rows"
                    continue
                timings[name] = time_in_graph_us(call)
            except Exception as error:  # noqa: BLE001 - a candidate that fails is not used
                plan.rejected[name] = f"{type(error).__name__}: {error}"[:300]
        best = min(timings, key=timings.get) if timings else DEQUANTIZE
        chosen.append(next((k for k in candidates(bucket) if _name(k) == best), None))
        plan.timings_us[bucket] = timings
    plan.kernels = tuple(chosen)
    del dense_t
    # The graphs' pools and the dense copy go back to the driver before the KV cache is sized.
    torch.cuda.empty_cache()
    return plan


def plan_for(
    packed_t: torch.Tensor,
    scale_t: torch.Tensor,
    zero_t: torch.Tensor,
    group_size: int,
    num_inputs: int,
    dtype: torch.dtype = torch.bfloat16,
) -> Int4Plan:
    """The measured plan for this weight shape (shared by every layer of the same shape)."""
    key = (tuple(packed_t.shape), group_size, num_inputs, dtype, packed_t.device)
    plan = _plans.get(key)
    if plan is None:
        plan = measure_plan(packed_t, scale_t, zero_t, group_size, num_inputs, dtype)
        _plans[key] = plan
    return plan
