"""A mixture-of-experts block (Qwen3-MoE, Mixtral): a router picks top-k experts per token, each
expert is a SiLU-gated MLP, and the token's output is the routing-weighted sum of its experts'.

    SparseMoeBlock.forward(hidden [num_tokens, hidden_size]) -> [num_tokens, hidden_size]
        routing = self.gate(hidden)                  # TopKRouter: weights, expert ids [T, k]
        return self.experts(hidden, routing)         # StackedExperts: the grouped torch path

The experts' weights are stacked, one tensor per projection for all experts:
    gate_up_proj [num_experts, 2 * intermediate, hidden]   (gate rows first, then up)
    down_proj    [num_experts, hidden, intermediate]
filled at load from a checkpoint's per-expert tensors, shard (expert, "gate" | "up" | "down").
fp8 experts (layers/moe_fp8.py) keep the same stacks as e4m3 codes beside float32 scales,
gate_up_scale / down_scale, loaded by the same shards.

Two paths behind StackedExperts.forward: on CUDA with the fused kernels on
(kernels/dispatch.py), the fused Triton path (kernels/fused_moe.py: alignment and two grouped
GEMMs on the device, no host sync, so the layer is captured in CUDA graphs), with the tile plan
of the step's token count from `tile_table` (tuned at start-up, kernels/moe_tuning.py); else
the torch path below (the reference the kernel tests compare with, and the CPU's path).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ladle.distributed.expert_dispatch import ALLTOALL, DEFAULT_TABLE, alltoall_experts
from ladle.distributed.tensor_parallel import SINGLE, TensorParallel
from ladle.kernels.dispatch import fused_kernels_enabled, use_fused_kernels
from ladle.kernels.moe_tiles import ExpertStacks, MoeTileTable, default_table
from ladle.model.layers.quant.fp8 import FP8_DTYPE, dequantize_stack
from ladle.model.layers.weight_loading import default_weight_loader
from ladle.model.load_errors import ModelLoadError

EXPERT_PROJECTIONS = ("gate", "up", "down")


@dataclass(frozen=True)
class Routing:
    """Which experts each token goes to, and with what weight.

    weights [num_tokens, top_k] in the hidden states' dtype; expert_ids [num_tokens, top_k]
    int64. Row t lists token t's experts in descending probability."""

    weights: torch.Tensor
    expert_ids: torch.Tensor


class TopKRouter(nn.Module):
    """Router logits (x W^T, W [num_experts, hidden]) -> softmax over all experts in float32 ->
    the top_k largest -> renormalised to sum 1 when norm_topk_prob -> cast to x's dtype.

    Not a ladle Linear on purpose: the quantization passes convert every Linear, and a router
    is tiny, read once per token, and decides which experts run: it stays in float."""

    def __init__(
        self, hidden_size: int, num_experts: int, top_k: int, norm_topk_prob: bool
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.num_experts = num_experts
        self.top_k = top_k
        self.norm_topk_prob = norm_topk_prob
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)

    def forward(self, hidden_states: torch.Tensor) -> Routing:
        logits = F.linear(hidden_states, self.weight)
        return self.route(logits, hidden_states.dtype)

    def route(self, logits: torch.Tensor, dtype: torch.dtype) -> Routing:
        """The torch routing of router logits [T, E] (see the class docstring)."""
        probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, expert_ids = torch.topk(probabilities, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return Routing(weights.to(dtype), expert_ids)

    def route_fused(self, hidden_states: torch.Tensor, expert_counts: torch.Tensor) -> Routing:
        """The same routing as forward with softmax, top-k, renormalisation and the per-expert
        count in one Triton launch (kernels/moe_routing.py), for the fused path."""
        # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
        # triton; tests/model/test_fused_kernel_dispatch.py).
        from ladle.kernels.gemv import gemv, gemv_applies
        from ladle.kernels.moe_routing import topk_softmax

        if gemv_applies(hidden_states, self.weight):
            # Batch 1: the GEMV, in the decode step's PDL chain (kernels/pdl.py), not cuBLAS.
            logits = gemv(hidden_states, self.weight)
        else:
            logits = F.linear(hidden_states, self.weight)
        weights, expert_ids = topk_softmax(
            logits, self.top_k, self.norm_topk_prob, hidden_states.dtype, expert_counts
        )
        return Routing(weights, expert_ids)

    @torch.no_grad()
    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        """Copy the checkpoint's router, which must be [num_experts, hidden_size]."""
        expected = (self.num_experts, self.hidden_size)
        if tuple(loaded_weight.shape) != expected:
            raise ModelLoadError(
                f"router of shape {tuple(loaded_weight.shape)} does not fit the config's "
                f"(num_experts={self.num_experts}, hidden_size={self.hidden_size}): expected "
                f"{expected}"
            )
        default_weight_loader(param.data, loaded_weight)

    def extra_repr(self) -> str:
        return (
            f"hidden={self.hidden_size}, experts={self.num_experts}, top_k={self.top_k}, "
            f"norm_topk_prob={self.norm_topk_prob}"
        )


class StackedExperts(nn.Module):
    """num_experts SiLU-gated MLPs, down(silu(gate(x)) * up(x)), with their weights stacked
    (see the module docstring), run on the tokens routed to each.

    On several ranks a rank holds either whole experts first_expert .. first_expert +
    num_experts - 1 (expert parallelism; checkpoint shards name experts by their global index)
    or every expert's slice `split` of the intermediate features (tensor parallelism:
    intermediate_size is then the slice's; `split` = (rank, ranks))."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        first_expert: int = 0,
        split: tuple[int, int] = (0, 1),
        expert_parallel: bool = False,
    ) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.first_expert = first_expert
        # Expert-parallel routing names one past the stack for other ranks' experts
        # (local_routing).
        self.expert_parallel = expert_parallel
        self.split = split
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.down_proj = nn.Parameter(
            torch.empty(num_experts, hidden_size, intermediate_size), requires_grad=False
        )
        # fp8 experts only (layers/moe_fp8.py): float32 scales, per output channel [E, N] or per
        # row and group of scale_group inputs [E, N, G].
        self.gate_up_scale: nn.Parameter | None = None
        self.down_scale: nn.Parameter | None = None
        self.scale_group = 0
        # The fused path's tile plans per token-count bucket, set by the start-up tuner.
        self.tile_table: MoeTileTable | None = None

    @property
    def is_fp8(self) -> bool:
        return self.gate_up_proj.dtype == FP8_DTYPE

    def stacks(self) -> ExpertStacks:
        """What the fused kernels read."""
        return ExpertStacks(
            self.gate_up_proj, self.down_proj, self.gate_up_scale, self.down_scale,
            self.scale_group,
        )  # fmt: skip

    def can_run_fused(self) -> bool:
        """Whether forward takes the fused Triton path: CUDA, the fused kernels on, Triton
        installed, and for fp8 codes a GPU that widens e4m3 in registers (Ada, sm_89, or newer).
        Only that path runs inside a CUDA graph (the torch path reads counts on the host)."""
        weight = self.gate_up_proj
        if not (weight.is_cuda and fused_kernels_enabled() and _triton_is_installed()):
            return False
        return not self.is_fp8 or torch.cuda.get_device_capability(weight.device) >= (8, 9)

    def forward(self, hidden_states: torch.Tensor, routing: Routing) -> torch.Tensor:
        if use_fused_kernels(hidden_states) and self.can_run_fused():
            # Imported here: a Triton kernel's file loads only once it runs (a CPU install has no
            # triton; tests/model/test_fused_kernel_dispatch.py).
            from ladle.kernels.fused_moe import fused_experts

            table = self.tile_table or default_table(self.scale_group)
            expert_ids = routing.expert_ids
            if self.expert_parallel:
                # Clamped: another rank's assignments (weight 0) then add nothing. One launch a
                # layer, so only where such ids occur.
                expert_ids = expert_ids.clamp(max=self.num_experts - 1)
            return fused_experts(
                hidden_states.contiguous(),
                routing.weights.contiguous(),
                expert_ids.contiguous(),
                self.stacks(),
                table.plan_for(hidden_states.shape[0]),
            )
        gate_up, down = self.float_stacks(hidden_states.dtype)
        return grouped_experts_forward(
            hidden_states, routing.weights, routing.expert_ids, gate_up, down
        )

    def float_stacks(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """The stacks as float matrices: themselves, or fp8 codes times their scales (the torch
        path's reference for fp8 experts; the CPU dequantizes once at load instead)."""
        if not self.is_fp8:
            return self.gate_up_proj, self.down_proj
        return (
            dequantize_stack(self.gate_up_proj, self.gate_up_scale, self.scale_group, dtype),
            dequantize_stack(self.down_proj, self.down_scale, self.scale_group, dtype),
        )

    def expected_shards(self, param: nn.Parameter) -> list[tuple[int, str]]:
        """Every (expert, projection) shard a checkpoint must fill in `param` (a stack or its
        scales)."""
        is_down = param is self.down_proj or param is self.down_scale
        projections = ("down",) if is_down else ("gate", "up")
        experts = range(self.first_expert, self.first_expert + self.num_experts)
        return [(e, p) for e in experts for p in projections]

    @torch.no_grad()
    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: tuple[int, str]
    ) -> None:
        """Copy one expert's gate, up or down matrix (HF's [out, in] layout), or its fp8 scales
        (ladle's canonical per-row layout, one row per output), into the stack."""
        expert, projection = shard_id
        expert -= self.first_expert  # this rank's stack holds its own experts only
        if not 0 <= expert < self.num_experts or projection not in EXPERT_PROJECTIONS:
            raise ModelLoadError(
                f"no expert shard {shard_id!r}: the config has num_experts={self.num_experts}"
            )
        loaded_weight = self._rank_slice(loaded_weight, projection)
        if projection == "down":
            target = param.data[expert]
        else:
            first_row = 0 if projection == "gate" else self.intermediate_size
            target = param.data[expert].narrow(0, first_row, self.intermediate_size)
        what = "scales" if param is self.gate_up_scale or param is self.down_scale else "projection"
        if tuple(loaded_weight.shape) != tuple(target.shape):
            raise ModelLoadError(
                f"expert {expert}'s {projection} {what} has shape "
                f"{tuple(loaded_weight.shape)}; the config (hidden_size={self.hidden_size}, "
                f"expert intermediate size={self.intermediate_size}) needs {tuple(target.shape)}"
            )
        if target.dtype == FP8_DTYPE and loaded_weight.dtype != FP8_DTYPE:
            raise ModelLoadError(
                f"expert {expert}'s {projection} projection is {loaded_weight.dtype}; this fp8 "
                f"checkpoint's experts must be {FP8_DTYPE}"
            )
        target.copy_(loaded_weight)

    def _rank_slice(self, loaded: torch.Tensor, projection: str) -> torch.Tensor:
        """This rank's slice of one expert's tensor under tensor parallelism: the gate's or up's
        rows (and their per-row scales), the down projection's columns (and its scale groups;
        a per-row scale is every rank's)."""
        rank, ranks = self.split
        if ranks == 1:
            return loaded
        if projection != "down":
            rows = self.intermediate_size
            if loaded.shape[0] != rows * ranks:
                raise ModelLoadError(
                    f"an expert's {projection} has {loaded.shape[0]} rows; {ranks} ranks of "
                    f"{rows} need {rows * ranks}"
                )
            return loaded.narrow(0, rank * rows, rows)
        if loaded.dim() < 2:
            return loaded
        columns = loaded.shape[1] // ranks
        if loaded.shape[1] != columns * ranks:
            raise ModelLoadError(
                f"an expert's down projection of {loaded.shape[1]} columns cannot be split over "
                f"{ranks} ranks (its quantization groups would straddle them)"
            )
        return loaded.narrow(1, rank * columns, columns)

    def extra_repr(self) -> str:
        fp8 = ", fp8" + (f" groups of {self.scale_group}" if self.scale_group else "")
        return (
            f"experts={self.num_experts}, hidden={self.hidden_size}, "
            f"intermediate={self.intermediate_size}{fp8 if self.is_fp8 else ''}"
        )


@functools.cache
def _triton_is_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


class SparseMoeBlock(nn.Module):
    """The MoE layer in place of a decoder layer's MLP: forward(hidden) -> hidden, the routing in
    `gate` (TopKRouter) and the experts in `experts` (StackedExperts); checkpoint names
    ...mlp.gate.weight and ...mlp.experts.{gate_up_proj, down_proj} (per-expert shards).

    It also counts the (token, expert) assignments of every forward in `expert_token_counts`
    [num_experts] on the device (in the fused routing kernel, or one index_add on the torch
    path; captured with the rest in a CUDA graph; rows a graph pads its batch with count too),
    which worker/expert_load.py sums over layers for /metrics and `ladle bench`. Under expert
    parallelism `dispatch` (distributed/expert_dispatch.py, set at start-up) names, per step
    size, how tokens reach the ranks holding their experts: one all-reduce or all-to-all."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        norm_topk_prob: bool,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.gate = TopKRouter(hidden_size, num_experts, top_k, norm_topk_prob)
        if tp.size > 1 and tp.expert_parallel:
            local = tp.divide(num_experts, "the number of experts")
            self.experts = StackedExperts(
                local, hidden_size, intermediate_size, first_expert=tp.rank * local,
                expert_parallel=True,
            )  # fmt: skip
        else:
            local_intermediate = tp.divide(intermediate_size, "the experts' intermediate size")
            self.experts = StackedExperts(
                num_experts, hidden_size, local_intermediate, split=(tp.rank, tp.size)
            )
        self.register_buffer(
            "expert_token_counts", torch.zeros(num_experts, dtype=torch.int64), persistent=False
        )
        self.register_buffer("_one", torch.ones(1, dtype=torch.int64), persistent=False)
        self.dispatch = DEFAULT_TABLE

    def init_buffers(self) -> None:
        """Zero the counts and set the constant one (the loader builds on the meta device)."""
        self.expert_token_counts.zero_()
        self._one.fill_(1)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if use_fused_kernels(hidden_states) and self.experts.can_run_fused():
            # Routing and counting in one launch; the experts then take the fused path too.
            routing = self.gate.route_fused(hidden_states, self.expert_token_counts)
        else:
            routing = self.gate(hidden_states)
            expert_ids = routing.expert_ids.reshape(-1)
            self.expert_token_counts.index_add_(
                0, expert_ids, self._one.expand(expert_ids.numel())
            )
        if self.tp.size == 1:
            return self.experts(hidden_states, routing)
        # Every rank has every token (the attention's all-reduce replicated them) and the whole
        # routing; each adds what its experts (or its slice of every expert) give, and the sum
        # over ranks is the layer's output.
        if self.tp.expert_parallel:
            if self._takes_alltoall(hidden_states.shape[0]):
                return alltoall_experts(
                    hidden_states, routing.weights, routing.expert_ids, self.tp,
                    self.experts.num_experts, self._run_local_experts,
                )  # fmt: skip
            routing = local_routing(routing, self.experts.first_expert, self.experts.num_experts)
        return self.tp.all_reduce(self.experts(hidden_states, routing))

    def _takes_alltoall(self, num_tokens: int) -> bool:
        """Whether this step's size takes the all-to-all form; never inside a CUDA graph (its
        split sizes are read on the host), where the all-reduce form is captured instead."""
        if self.dispatch.form_for(num_tokens) != ALLTOALL:
            return False
        return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())

    def _run_local_experts(
        self, hidden_states: torch.Tensor, weights: torch.Tensor, local_ids: torch.Tensor
    ) -> torch.Tensor:
        return self.experts(hidden_states, Routing(weights, local_ids))


def local_routing(routing: Routing, first_expert: int, num_local: int) -> Routing:
    """The routing as one expert-parallel rank runs it: ids shifted to its stack; assignments to
    other ranks' experts get weight 0 and the id num_local (one past its stack: the torch path
    skips them; the fused path clamps them to its last expert, whose rows then add nothing)."""
    local_ids = routing.expert_ids - first_expert
    mine = (local_ids >= 0) & (local_ids < num_local)
    return Routing(
        routing.weights * mine.to(routing.weights.dtype),
        torch.where(mine, local_ids, torch.full_like(local_ids, num_local)),
    )


def grouped_experts_forward(
    hidden_states: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gate_up_proj: torch.Tensor,
    down_proj: torch.Tensor,
) -> torch.Tensor:
    """The torch path of the experts: [num_tokens, hidden] -> [num_tokens, hidden].

    The num_tokens * top_k (token, expert) assignments are sorted by expert; each expert that got
    any runs its MLP once on its rows (index_select), scales them by their routing weight and
    adds them back into their tokens' rows (index_add_). One host sync reads the per-expert
    counts, which is why this path cannot be captured in a CUDA graph: the fused kernel pads
    the sorted tokens into fixed blocks instead.
    """
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "the torch MoE path reads per-expert token counts on the host and cannot run "
            "inside a CUDA graph; the fused path (kernels/fused_moe.py) can: leave "
            "LADLE_FUSED_KERNELS on, install Triton, or run with enforce_eager"
        )
    num_tokens, top_k = topk_ids.shape
    num_experts, double_intermediate, _ = gate_up_proj.shape
    output = torch.zeros_like(hidden_states)
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    token_of = order // top_k  # the token of each sorted assignment
    weight_of = topk_weights.reshape(-1, 1).index_select(0, order)
    # Ids past the stack (another expert-parallel rank's experts) sort last and are skipped.
    counts = torch.bincount(flat_ids, minlength=num_experts + 1)[:num_experts].tolist()
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = token_of[start : start + count]
        expert_input = hidden_states.index_select(0, rows)
        gate, up = F.linear(expert_input, gate_up_proj[expert]).split(
            double_intermediate // 2, dim=-1
        )
        expert_output = F.linear(F.silu(gate) * up, down_proj[expert])
        output.index_add_(0, rows, expert_output * weight_of[start : start + count])
        start += count
    return output
