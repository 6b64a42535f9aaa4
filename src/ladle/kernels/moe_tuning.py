"""Choosing the fused MoE path's tiles at start-up by timing them on the device, for the model's
own shapes, per token-count bucket; the choice is cached on disk.

vLLM ships hand-tuned JSON tables per GPU and shape and warns "Using default MoE config,
performance might be sub-optimal" wherever none exists. ladle ships no tables: for each bucket
(1, 2, 4, ... tokens up to the step's token budget) it times every candidate tile of each GEMM
on the model's first MoE layer (its real weights; routing drawn at random over all experts and
rotated between repetitions, so a batch-1 timing does not read the same experts from L2 every
call) and keeps the fastest plan:
  - rows tiles (small buckets): gate-up and down timed separately, no alignment;
  - grouped tiles: per block_m, the faster alignment (one Triton program or the torch sort)
    plus the fastest gate-up and down of that block_m.
Every candidate is built once on a thread pool first (parallel_builds.py), then timed as a CUDA
graph of a few calls replayed (GPU time, as a decode graph runs it, not Python's launching), so
tuning costs the builds plus a few thousand short launches. The table is written to
  <ladle cache>/moe_tiles/<device>-<shape>-<dtype>-<weights>-triton<version>-v<N>.json
and read back by the next start-up on the same device, shapes, dtype and Triton (no timing then;
the warm-up still builds the chosen variants).
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import triton

from ladle.bench.gpu_timing import calls_in_graph_us
from ladle.kernels.fused_moe import check_plan_fits, launch_down, launch_gate_up
from ladle.kernels.moe_align import TRITON_MAX_ASSIGNMENTS, align_to_expert_blocks
from ladle.kernels.moe_tiles import (
    GROUP_SCALES,
    ExpertStacks,
    MoePlan,
    MoeTile,
    MoeTileTable,
    token_buckets,
)
from ladle.kernels.parallel_builds import builds_only

# Bump when a kernel changes what a tile means or the timing changes what wins: old cached
# tables are then ignored.
TUNING_VERSION = 4
# Rows tiles are candidates up to this many tokens (beyond, every expert's weight would be read
# by many programs).
ROWS_MAX_TOKENS = 32
# (n, k, warps). A rows program loads 2 x n (gate-up) or top_k x n (down) weight rows of k
# inputs at once: these keep that tile at 2-16 K elements, from whole 2,048-wide rows to
# 256-wide slices of many rows.
ROWS_SHAPES = (
    (1, 1024, 4), (2, 512, 4), (2, 1024, 4), (2, 2048, 8), (4, 256, 4), (4, 512, 4),
    (4, 1024, 8), (8, 256, 4), (16, 256, 4),
)  # fmt: skip
# Grouped tiles by block_m: (block_n, block_k, num_warps, num_stages). Gate-up keeps two
# accumulators and two weight tiles a step, so the largest tiles stay within registers and
# shared memory.
GROUPED_SHAPES = {
    16: ((64, 128, 4, 4), (128, 128, 4, 3), (64, 64, 4, 4)),
    32: ((64, 128, 4, 4), (128, 64, 4, 3)),
    64: ((64, 64, 4, 4), (128, 64, 4, 3), (128, 128, 8, 2)),
    128: ((128, 64, 8, 3), (64, 64, 4, 4)),
}
NUM_ROUTINGS = 4  # routings rotated between repetitions
# Graph replays timed per candidate: few, since each also runs the calls eagerly and once
# before timing, and start-up pays for every candidate of every bucket up to the token budget
# (five samples of four replays took the Qwen3-30B-A3B shape's tuning from 5 to 18 s).
SAMPLES = 3

Timer = Callable[[Callable[[int], object]], float]


@dataclass(frozen=True)
class MoeShape:
    """What a tile table is tuned for."""

    num_experts: int
    hidden_size: int
    intermediate_size: int
    top_k: int
    dtype: str
    weights: str  # "float", "fp8-channel" or "fp8-group<inputs>"

    @classmethod
    def of(cls, stacks: ExpertStacks, top_k: int, dtype: torch.dtype) -> MoeShape:
        num_experts, double_intermediate, hidden_size = stacks.gate_up.shape
        if stacks.gate_up_scale is None:
            weights = "float"
        elif stacks.scale_kind == GROUP_SCALES:
            weights = f"fp8-group{stacks.scale_group}"
        else:
            weights = "fp8-channel"
        return cls(num_experts, hidden_size, double_intermediate // 2, top_k,
                   str(dtype).removeprefix("torch."), weights)  # fmt: skip

    def cache_name(self, device_name: str, max_tokens: int) -> str:
        device = "".join(c if c.isalnum() else "_" for c in device_name)
        return (
            f"{device}-e{self.num_experts}-h{self.hidden_size}-i{self.intermediate_size}"
            f"-k{self.top_k}-{self.dtype}-{self.weights}-t{max_tokens}"
            f"-triton{triton.__version__}-v{TUNING_VERSION}.json"
        )


def tile_cache_dir() -> Path:
    from ladle.model.default_model import default_cache_dir

    return default_cache_dir() / "moe_tiles"


def rows_candidates(num_tokens: int) -> list[MoeTile]:
    if num_tokens > ROWS_MAX_TOKENS:
        return []
    return [MoeTile("rows", block_n=n, block_k=k, num_warps=w) for n, k, w in ROWS_SHAPES]


def grouped_candidates(num_tokens: int, shape: MoeShape, scale_group: int) -> list[MoeTile]:
    """Grouped tiles whose block_m suits the rows an expert gets on average (twice that, at
    least 16), and whose K steps fit fp8 scale groups."""
    rows_per_expert = num_tokens * shape.top_k / shape.num_experts
    largest_m = max(16, triton.next_power_of_2(max(1, int(2 * rows_per_expert))))
    tiles = []
    for block_m, shapes in GROUPED_SHAPES.items():
        if block_m > largest_m:
            continue
        for block_n, block_k, warps, stages in shapes:
            if scale_group and scale_group % block_k:
                continue
            group_m = 8 if block_m >= 64 else 4
            tiles.append(MoeTile("grouped", block_n, block_k, block_m, group_m, warps, stages))
    return tiles


def cuda_timer(run: Callable[[int], object]) -> float:
    """Seconds a call of run(repetition) takes on the GPU: one call per routing replayed from one
    CUDA graph, as a decode graph runs them (the median of SAMPLES replays). Timed as launched
    from Python, a batch-1 rows call (~10 us of GPU) measured its launch instead: the first sweep
    on an H200 ranked tiles by host time and kept ones that a decode graph then ran slowly."""
    calls = [functools.partial(run, repetition) for repetition in range(NUM_ROUTINGS)]
    return calls_in_graph_us(calls, replays=1, samples=SAMPLES) / 1e6


@dataclass
class TuningResult:
    table: MoeTileTable
    seconds: float
    from_cache: bool
    path: Path | None
    timings: dict[int, dict[str, float]]  # bucket -> plan description -> seconds a call


def tune_tile_table(
    stacks: ExpertStacks,
    top_k: int,
    dtype: torch.dtype,
    max_tokens: int,
    timer: Timer = cuda_timer,
    cache_dir: Path | None = None,
    device_name: str | None = None,
) -> TuningResult:
    """The tile table for `stacks` (one MoE layer's weights on the device), read from the disk
    cache or tuned now and written there."""
    started = time.perf_counter()
    device = stacks.gate_up.device
    shape = MoeShape.of(stacks, top_k, dtype)
    if device_name is None:
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    directory = cache_dir or tile_cache_dir()
    path = directory / shape.cache_name(device_name, max_tokens)
    cached = _read_table(path)
    if cached is not None:
        return TuningResult(cached, time.perf_counter() - started, True, path, {})
    buckets = token_buckets(max_tokens)
    inputs = {b: _inputs(b, shape, stacks, dtype) for b in buckets}
    candidates = {
        b: rows_candidates(b) + grouped_candidates(b, shape, stacks.scale_group) for b in buckets
    }
    _build_all(stacks, inputs, candidates)
    plans, timings = [], {}
    for bucket in buckets:
        plan, bucket_timings = _best_plan(stacks, inputs[bucket], candidates[bucket], timer)
        plans.append(plan)
        timings[bucket] = bucket_timings
    table = MoeTileTable(buckets, tuple(plans))
    _write_table(path, table, shape, device_name, timings)
    return TuningResult(table, time.perf_counter() - started, False, path, timings)


@dataclass
class _BucketInputs:
    hidden: torch.Tensor
    topk_weights: list[torch.Tensor]
    topk_ids: list[torch.Tensor]
    intermediate: torch.Tensor


def _inputs(num_tokens: int, shape: MoeShape, stacks: ExpertStacks, dtype) -> _BucketInputs:
    device = stacks.gate_up.device
    generator = torch.Generator(device=device).manual_seed(num_tokens)
    hidden = torch.randn(num_tokens, shape.hidden_size, device=device, dtype=dtype,
                         generator=generator)  # fmt: skip
    ids, weights = [], []
    for _ in range(NUM_ROUTINGS):
        scores = torch.rand(num_tokens, shape.num_experts, device=device, generator=generator)
        top = scores.topk(shape.top_k, dim=-1)
        ids.append(top.indices)
        weights.append(torch.softmax(top.values, dim=-1).to(dtype))
    intermediate = torch.randn(num_tokens * shape.top_k, shape.intermediate_size, device=device,
                               dtype=dtype, generator=generator)  # fmt: skip
    return _BucketInputs(hidden, weights, ids, intermediate)


def _aligned(stacks: ExpertStacks, inputs: _BucketInputs, block_m: int):
    num_experts = stacks.gate_up.shape[0]
    return [align_to_expert_blocks(ids, num_experts, block_m) for ids in inputs.topk_ids]


def _alignments(num_tokens: int, top_k: int) -> tuple[str, ...]:
    if num_tokens * top_k > TRITON_MAX_ASSIGNMENTS:
        return ("torch",)
    return ("triton", "torch")


def _launchers(stacks: ExpertStacks, inputs: _BucketInputs, tile: MoeTile, blocks):
    """(gate-up, down) calls of one tile, each taking the repetition number."""
    dtype = inputs.hidden.dtype

    def block_of(repetition: int):
        return None if blocks is None else blocks[repetition % NUM_ROUTINGS]

    def gate_up(repetition: int):
        ids = inputs.topk_ids[repetition % NUM_ROUTINGS]
        return launch_gate_up(inputs.hidden, ids, stacks, tile, block_of(repetition))

    def down(repetition: int):
        index = repetition % NUM_ROUTINGS
        return launch_down(
            inputs.intermediate, inputs.topk_weights[index], inputs.topk_ids[index], stacks, tile,
            block_of(repetition), dtype,
        )  # fmt: skip

    return gate_up, down


def _build_all(stacks, inputs: dict[int, _BucketInputs], candidates) -> None:
    """Submit every candidate's builds (and the alignment's) to the build pool at once. A
    candidate the device cannot load (too much shared memory) fails here or when timed; the
    timing skips it either way."""
    try:
        _submit_builds(stacks, inputs, candidates)
    except Exception as error:  # noqa: BLE001 - the timing pass builds what is left, one by one
        if "out of resource" not in str(error).lower():
            raise


def _submit_builds(stacks, inputs: dict[int, _BucketInputs], candidates) -> None:
    with builds_only():
        for bucket, tiles in candidates.items():
            aligned = {}
            for tile in tiles:
                blocks = None
                if tile.kind == "grouped":
                    if tile.block_m not in aligned:
                        aligned[tile.block_m] = _aligned(stacks, inputs[bucket], tile.block_m)
                    blocks = aligned[tile.block_m]
                for launch in _launchers(stacks, inputs[bucket], tile, blocks):
                    try:
                        launch(0)
                    except Exception:  # noqa: BLE001 - a candidate that cannot build is skipped
                        continue


def _time_or_none(timer: Timer, run) -> float | None:
    try:
        return timer(run)
    except Exception as error:  # noqa: BLE001 - out of shared memory or registers: not a choice
        if "out of resource" in str(error).lower() or "OutOfResources" in type(error).__name__:
            return None
        raise


def _align_run(stacks: ExpertStacks, inputs: _BucketInputs, block_m: int, how: str):
    num_experts = stacks.gate_up.shape[0]

    def align(repetition: int):
        ids = inputs.topk_ids[repetition % NUM_ROUTINGS]
        return align_to_expert_blocks(ids, num_experts, block_m, with_triton=how == "triton")

    return align


def _best_plan(stacks, inputs: _BucketInputs, tiles: list[MoeTile], timer: Timer):
    timings: dict[str, float] = {}
    best_rows: dict[str, tuple[float, MoeTile]] = {}
    grouped: dict[int, dict[str, tuple[float, MoeTile]]] = {}
    aligned: dict[int, list] = {}
    align_seconds: dict[int, tuple[float, str]] = {}  # block_m -> (seconds, the faster one)
    for tile in tiles:
        blocks = None
        if tile.kind == "grouped":
            if tile.block_m not in aligned:
                aligned[tile.block_m] = _aligned(stacks, inputs, tile.block_m)
                top_k = inputs.topk_ids[0].shape[1]
                align_seconds[tile.block_m] = min(
                    (timer(_align_run(stacks, inputs, tile.block_m, how)), how)
                    for how in _alignments(inputs.hidden.shape[0], top_k)
                )
            blocks = aligned[tile.block_m]
        gate_up, down = _launchers(stacks, inputs, tile, blocks)
        for gemm, run in (("gate_up", gate_up), ("down", down)):
            seconds = _time_or_none(timer, run)
            if seconds is None:
                continue
            timings[f"{gemm} {tile.describe()}"] = seconds
            best = best_rows if tile.kind == "rows" else grouped.setdefault(tile.block_m, {})
            if gemm not in best or seconds < best[gemm][0]:
                best[gemm] = (seconds, tile)
    options: list[tuple[float, MoePlan]] = []
    if len(best_rows) == 2:
        options.append((best_rows["gate_up"][0] + best_rows["down"][0],
                        MoePlan(best_rows["gate_up"][1], best_rows["down"][1])))  # fmt: skip
    for block_m, best in grouped.items():
        if len(best) == 2:
            align, how = align_seconds[block_m]
            total = align + best["gate_up"][0] + best["down"][0]
            options.append((total, MoePlan(best["gate_up"][1], best["down"][1], how)))
    if not options:
        raise RuntimeError(f"no fused MoE tile ran for {inputs.hidden.shape[0]} tokens")
    seconds, plan = min(options, key=lambda option: option[0])
    check_plan_fits(plan, stacks)
    timings["chosen"] = seconds
    return plan, timings


def _read_table(path: Path) -> MoeTileTable | None:
    try:
        return MoeTileTable.from_json(json.loads(path.read_text())["table"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: tune again


def _write_table(path: Path, table: MoeTileTable, shape, device_name: str, timings) -> None:
    """Write atomically (a rename), so a concurrent start-up never reads half a file; a cache
    that cannot be written only costs the next start-up its tuning."""
    record = {
        "device": device_name,
        "shape": shape.__dict__,
        "triton": triton.__version__,
        "table": table.to_json(),
        "timings_us": {
            str(b): {k: round(v * 1e6, 2) for k, v in t.items()} for b, t in timings.items()
        },
        "median_chosen_us": statistics.median(t["chosen"] for t in timings.values()) * 1e6,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(record, indent=1))
        partial.replace(path)
    except OSError:
        pass
