"""The plain data of the fused MoE path (no Triton here: the model layer imports it on the CPU):
the expert stacks a call reads (ExpertStacks) and the tile configurations per token-count bucket
(MoeTileTable), which the model layer holds and the tuner (moe_tuning.py) fills on the device.

A step of T tokens takes the plan of the smallest bucket >= T (the largest bucket above all
buckets). A plan names, for each of the two GEMMs, either a row-at-a-time tile (`rows` kind: one
program per assignment, or per token for down, reading only the experts its rows chose; no
sorting) or a grouped tile (`grouped`: the assignments sorted and padded into blocks of block_m
rows of one expert, moe_align.py, then tensor-core GEMMs over the blocks). Both GEMMs of a
grouped plan share one alignment, so they share block_m.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass, replace
from typing import Literal

import torch

TileKind = Literal["rows", "grouped"]
NO_SCALES, CHANNEL_SCALES, GROUP_SCALES = 0, 1, 2


@dataclass(frozen=True)
class ExpertStacks:
    """The stacked expert matrices (layers/moe.py's layout) and, for fp8 codes, their float32
    scales: per output channel [E, N], or per row and group of scale_group inputs [E, N, G] (a
    checkpoint's 128x128 blocks repeated over their rows, as quant/fp8_block.py keeps them)."""

    gate_up: torch.Tensor  # [E, 2I, H]
    down: torch.Tensor  # [E, H, I]
    gate_up_scale: torch.Tensor | None = None  # [E, 2I] or [E, 2I, ceil(H / scale_group)]
    down_scale: torch.Tensor | None = None  # [E, H] or [E, H, ceil(I / scale_group)]
    scale_group: int = 0  # inputs per group scale; 0 for per-channel or no scales

    @property
    def scale_kind(self) -> int:
        if self.gate_up_scale is None:
            return NO_SCALES
        return GROUP_SCALES if self.gate_up_scale.dim() == 3 else CHANNEL_SCALES


@dataclass(frozen=True)
class MoeTile:
    """One GEMM's launch configuration. rows: block_n output columns x block_k inputs per step of
    one assignment (gate-up) or one token (down); grouped: block_m x block_n outputs, block_k
    inputs per step, group_m blocks of rows share their weight tiles in L2."""

    kind: TileKind
    block_n: int
    block_k: int
    block_m: int = 1
    group_m: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def describe(self) -> str:
        if self.kind == "rows":
            return f"rows n{self.block_n} k{self.block_k} w{self.num_warps}"
        return (
            f"grouped m{self.block_m} n{self.block_n} k{self.block_k} g{self.group_m} "
            f"w{self.num_warps} s{self.num_stages}"
        )


@dataclass(frozen=True)
class MoePlan:
    """The tiles of the two GEMMs for one bucket of token counts, and for grouped tiles which
    alignment sorts the assignments (moe_align.py: "triton", one program, or "torch")."""

    gate_up: MoeTile
    down: MoeTile
    align: Literal["triton", "torch"] = "triton"

    @property
    def block_m(self) -> int | None:
        """The alignment's block rows, or None when neither GEMM needs sorted assignments."""
        for tile in (self.gate_up, self.down):
            if tile.kind == "grouped":
                return tile.block_m
        return None

    def __post_init__(self) -> None:
        grouped = {t.block_m for t in (self.gate_up, self.down) if t.kind == "grouped"}
        if len(grouped) > 1:
            raise ValueError(f"the two grouped tiles of a plan share block_m, not {grouped}")


@dataclass(frozen=True)
class MoeTileTable:
    """Plans by token-count bucket: buckets ascending, one plan each."""

    buckets: tuple[int, ...]
    plans: tuple[MoePlan, ...]

    def plan_for(self, num_tokens: int) -> MoePlan:
        index = bisect.bisect_left(self.buckets, num_tokens)
        return self.plans[min(index, len(self.plans) - 1)]

    def to_json(self) -> dict:
        return {
            "buckets": list(self.buckets),
            "plans": [
                {"gate_up": asdict(p.gate_up), "down": asdict(p.down), "align": p.align}
                for p in self.plans
            ],
        }

    @classmethod
    def from_json(cls, data: dict) -> MoeTileTable:
        plans = tuple(
            MoePlan(MoeTile(**plan["gate_up"]), MoeTile(**plan["down"]), plan["align"])
            for plan in data["plans"]
        )
        buckets = tuple(int(b) for b in data["buckets"])
        if len(buckets) != len(plans) or list(buckets) != sorted(buckets):
            raise ValueError("a tile table needs ascending buckets, one plan each")
        return cls(buckets, plans)


def token_buckets(max_tokens: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the first power of two >= max_tokens."""
    buckets = [1]
    while buckets[-1] < max_tokens:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


# Untuned plans (a model built outside the Worker, tests): rows tiles for tiny steps, 64-row
# grouped tiles above.
DEFAULT_ROWS_PLAN = MoePlan(
    MoeTile("rows", block_n=16, block_k=256), MoeTile("rows", block_n=16, block_k=256)
)
DEFAULT_GROUPED_PLAN = MoePlan(
    MoeTile("grouped", block_n=64, block_k=64, block_m=64, group_m=8, num_stages=3),
    MoeTile("grouped", block_n=64, block_k=64, block_m=64, group_m=8, num_stages=3),
)
DEFAULT_TABLE = MoeTileTable((4, 1 << 30), (DEFAULT_ROWS_PLAN, DEFAULT_GROUPED_PLAN))


def default_table(scale_group: int = 0) -> MoeTileTable:
    """The untuned table; for fp8 scale groups narrower than its grouped tiles' K step (32), K
    steps of one group."""
    if not scale_group or scale_group % DEFAULT_GROUPED_PLAN.gate_up.block_k == 0:
        return DEFAULT_TABLE
    narrow = MoePlan(
        replace(DEFAULT_GROUPED_PLAN.gate_up, block_k=scale_group),
        replace(DEFAULT_GROUPED_PLAN.down, block_k=scale_group),
    )
    return MoeTileTable(DEFAULT_TABLE.buckets, (DEFAULT_ROWS_PLAN, narrow))
