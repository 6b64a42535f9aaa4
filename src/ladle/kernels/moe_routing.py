"""Top-k routing of the fused MoE path in one launch: router logits [T, E] -> softmax in float32
-> the top_k largest, in descending order -> renormalised to sum 1 when asked -> weights in the
hidden dtype [T, k] and expert ids int64 [T, k]; each chosen expert's token count incremented in
the same program (the per-expert load of worker/expert_load.py).

The torch router (layers/moe.py TopKRouter) takes softmax, topk, a sum, a division, a cast, and
the count's index_add: six launches a layer, about as long as the batch-1 expert GEMMs under a
decode graph. Same arithmetic here (float32 softmax, the renormalisation before the one
rounding); equal probabilities go to the lower expert index.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ladle.kernels.pdl import enter_dependent_launch, pdl_launch


@triton.jit
def _top_slot(remaining, experts, EXPERTS_POW2: tl.constexpr):
    """The largest value left and its expert (the lowest index among equals)."""
    best = tl.max(remaining, axis=0)
    index = tl.min(tl.where(remaining == best, experts, EXPERTS_POW2), axis=0)
    return best, index


@triton.jit
def _topk_softmax_kernel(
    logits_ptr,
    weights_ptr,
    ids_ptr,
    counts_ptr,
    num_experts,
    stride_logits,
    TOP_K: tl.constexpr,
    EXPERTS_POW2: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    COUNT: tl.constexpr,
    USE_PDL: tl.constexpr = False,
):
    enter_dependent_launch(USE_PDL)  # reads the router's logits at once (kernels/pdl.py)
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, EXPERTS_POW2)
    is_expert = experts < num_experts
    logits = tl.load(logits_ptr + token * stride_logits + experts, mask=is_expert,
                     other=-float("inf")).to(tl.float32)  # fmt: skip
    shifted = tl.exp(logits - tl.max(logits, axis=0))
    shifted = tl.where(is_expert, shifted, 0.0)
    probabilities = shifted / tl.sum(shifted, axis=0)
    # Two passes over the same choices: the first sums the chosen probabilities, the second
    # stores them divided by that sum (renormalised before the one rounding, as the torch
    # router does).
    total = 1.0
    if RENORMALIZE:
        remaining = tl.where(is_expert, probabilities, -1.0)
        total = 0.0
        for _ in tl.static_range(TOP_K):
            best, index = _top_slot(remaining, experts, EXPERTS_POW2)
            total += best
            remaining = tl.where(experts == index, -1.0, remaining)
    remaining = tl.where(is_expert, probabilities, -1.0)
    for slot in tl.static_range(TOP_K):
        best, index = _top_slot(remaining, experts, EXPERTS_POW2)
        weight = (best / total).to(weights_ptr.dtype.element_ty)
        tl.store(weights_ptr + token * TOP_K + slot, weight)
        tl.store(ids_ptr + token * TOP_K + slot, index.to(tl.int64))
        if COUNT:
            tl.atomic_add(counts_ptr + index, 1, sem="relaxed")
        remaining = tl.where(experts == index, -1.0, remaining)


def topk_softmax(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    weights_dtype: torch.dtype,
    expert_counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] in weights_dtype, expert ids int64 [T, k]) of router logits [T, E] (rows
    contiguous); expert_counts (int64 [E], optional) gains one per chosen (token, expert)."""
    num_tokens, num_experts = logits.shape
    weights = torch.empty((num_tokens, top_k), dtype=weights_dtype, device=logits.device)
    ids = torch.empty((num_tokens, top_k), dtype=torch.int64, device=logits.device)
    if num_tokens == 0:
        return weights, ids
    _topk_softmax_kernel[(num_tokens,)](
        logits,
        weights,
        ids,
        expert_counts if expert_counts is not None else ids,
        num_experts,
        logits.stride(0),
        TOP_K=top_k,
        EXPERTS_POW2=triton.next_power_of_2(num_experts),
        RENORMALIZE=renormalize,
        COUNT=expert_counts is not None,
        num_warps=1 if num_experts <= 256 else 4,
        **pdl_launch(logits.device, num_tokens),
    )
    return weights, ids
