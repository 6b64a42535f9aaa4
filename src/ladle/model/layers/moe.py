"""A mixture-of-experts block (Qwen3-MoE, Mixtral): a router picks top-k experts per token, each
expert is a SiLU-gated MLP, and the token's output is the routing-weighted sum of its experts'.

    SparseMoeBlock.forward(hidden [num_tokens, hidden_size]) -> [num_tokens, hidden_size]
        routing = self.gate(hidden)                  # TopKRouter: weights, expert ids [T, k]
        return self.experts(hidden, routing)         # StackedExperts: the grouped torch path

The experts' weights are stacked, one tensor per projection for all experts:
    gate_up_proj [num_experts, 2 * intermediate, hidden]   (gate rows first, then up)
    down_proj    [num_experts, hidden, intermediate]
filled at load from a checkpoint's per-expert tensors, shard (expert, "gate" | "up" | "down").
That is the layout a fused grouped kernel reads (one pointer and an expert stride per matrix),
so the fused GPU path and expert parallelism can replace `StackedExperts.forward` (or the whole
block's forward) without changing the block's call, its parameters or the loader.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

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
        probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, expert_ids = torch.topk(probabilities, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return Routing(weights.to(hidden_states.dtype), expert_ids)

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
    (see the module docstring), run on the tokens routed to each."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Parameter(
            torch.empty(num_experts, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.down_proj = nn.Parameter(
            torch.empty(num_experts, hidden_size, intermediate_size), requires_grad=False
        )

    def forward(self, hidden_states: torch.Tensor, routing: Routing) -> torch.Tensor:
        return grouped_experts_forward(
            hidden_states, routing.weights, routing.expert_ids, self.gate_up_proj, self.down_proj
        )

    def expected_shards(self, param: nn.Parameter) -> list[tuple[int, str]]:
        """Every (expert, projection) shard a checkpoint must fill in `param`."""
        projections = ("down",) if param is self.down_proj else ("gate", "up")
        return [(e, p) for e in range(self.num_experts) for p in projections]

    @torch.no_grad()
    def weight_loader(
        self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: tuple[int, str]
    ) -> None:
        """Copy one expert's gate, up or down matrix (HF's [out, in] layout) into the stack."""
        expert, projection = shard_id
        if not 0 <= expert < self.num_experts or projection not in EXPERT_PROJECTIONS:
            raise ModelLoadError(
                f"no expert shard {shard_id!r}: the config has num_experts={self.num_experts}"
            )
        if projection == "down":
            target = param.data[expert]
        else:
            first_row = 0 if projection == "gate" else self.intermediate_size
            target = param.data[expert].narrow(0, first_row, self.intermediate_size)
        if tuple(loaded_weight.shape) != tuple(target.shape):
            raise ModelLoadError(
                f"expert {expert}'s {projection} projection has shape "
                f"{tuple(loaded_weight.shape)}; the config (hidden_size={self.hidden_size}, "
                f"expert intermediate size={self.intermediate_size}) needs {tuple(target.shape)}"
            )
        target.copy_(loaded_weight)

    def extra_repr(self) -> str:
        return (
            f"experts={self.num_experts}, hidden={self.hidden_size}, "
            f"intermediate={self.intermediate_size}"
        )


class SparseMoeBlock(nn.Module):
    """The MoE layer in place of a decoder layer's MLP: forward(hidden) -> hidden, the routing in
    `gate` (TopKRouter) and the experts in `experts` (StackedExperts); checkpoint names
    ...mlp.gate.weight and ...mlp.experts.{gate_up_proj, down_proj} (per-expert shards).

    The interface a fused kernel keeps: a fused MoE path (routing, token sorting and both
    grouped GEMMs on the device) replaces this forward behind the same call and reads the same
    parameters; expert parallelism would give each rank a slice of the stacked experts and
    exchange tokens around the same call."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        norm_topk_prob: bool,
    ) -> None:
        super().__init__()
        self.gate = TopKRouter(hidden_size, num_experts, top_k, norm_topk_prob)
        self.experts = StackedExperts(num_experts, hidden_size, intermediate_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.experts(hidden_states, self.gate(hidden_states))


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
            "inside a CUDA graph; run MoE models with enforce_eager until the fused kernel lands"
        )
    num_tokens, top_k = topk_ids.shape
    num_experts, double_intermediate, _ = gate_up_proj.shape
    output = torch.zeros_like(hidden_states)
    flat_ids = topk_ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)
    token_of = order // top_k  # the token of each sorted assignment
    weight_of = topk_weights.reshape(-1, 1).index_select(0, order)
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
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
