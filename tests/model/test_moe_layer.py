"""The MoE block (layers/moe.py) against a naive reference that runs every token's experts one
by one, at awkward sizes: 1, 7 and 513 tokens, experts that get no token, every token on one
expert; and its router's softmax, top-k and renormalisation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ladle.model.layers.moe import (
    Routing,
    SparseMoeBlock,
    TopKRouter,
    grouped_experts_forward,
)

HIDDEN = 48
INTERMEDIATE = 24
NUM_EXPERTS = 8


def _block(top_k: int, norm_topk_prob: bool, seed: int = 0) -> SparseMoeBlock:
    generator = torch.Generator().manual_seed(seed)
    block = SparseMoeBlock(HIDDEN, NUM_EXPERTS, top_k, INTERMEDIATE, norm_topk_prob)
    with torch.no_grad():
        for param in block.parameters():
            param.copy_(0.2 * torch.randn(param.shape, generator=generator))
    return block


def _naive_router(block: SparseMoeBlock, hidden: torch.Tensor) -> Routing:
    """softmax -> top-k -> optional renormalisation, written out per token."""
    weights, ids = [], []
    for row in hidden:
        probabilities = torch.softmax(block.gate.weight.float() @ row.float(), dim=0)
        chosen = sorted(range(NUM_EXPERTS), key=lambda e: -probabilities[e].item())
        chosen = chosen[: block.gate.top_k]
        values = probabilities[chosen]
        if block.gate.norm_topk_prob:
            values = values / values.sum()
        weights.append(values.to(hidden.dtype))
        ids.append(torch.tensor(chosen))
    return Routing(torch.stack(weights), torch.stack(ids))


def _naive_experts(
    block: SparseMoeBlock, hidden: torch.Tensor, routing: Routing
) -> torch.Tensor:
    """Each token, each of its experts, one at a time."""
    experts = block.experts
    output = torch.zeros_like(hidden)
    for token in range(hidden.shape[0]):
        for slot in range(routing.expert_ids.shape[1]):
            expert = int(routing.expert_ids[token, slot])
            gate_up = experts.gate_up_proj[expert]
            gate = gate_up[:INTERMEDIATE] @ hidden[token]
            up = gate_up[INTERMEDIATE:] @ hidden[token]
            down = experts.down_proj[expert] @ (F.silu(gate) * up)
            output[token] += routing.weights[token, slot] * down
    return output


@pytest.mark.parametrize("num_tokens", [1, 7, 513])
@pytest.mark.parametrize(("top_k", "norm_topk_prob"), [(2, True), (2, False), (3, True)])
@torch.no_grad()
def test_block_matches_the_per_token_reference(num_tokens, top_k, norm_topk_prob):
    block = _block(top_k, norm_topk_prob)
    hidden = torch.randn(num_tokens, HIDDEN, generator=torch.Generator().manual_seed(num_tokens))
    routing = block.gate(hidden)
    expected_routing = _naive_router(block, hidden)
    torch.testing.assert_close(routing.weights, expected_routing.weights)
    assert torch.equal(routing.expert_ids, expected_routing.expert_ids)
    if norm_topk_prob:
        torch.testing.assert_close(routing.weights.sum(-1), torch.ones(num_tokens))
    else:
        assert (routing.weights.sum(-1) < 1).all()
    expected = _naive_experts(block, hidden, expected_routing)
    torch.testing.assert_close(block(hidden), expected, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_experts_with_no_tokens_and_all_tokens_on_one_expert():
    block = _block(top_k=2, norm_topk_prob=True)
    hidden = torch.randn(9, HIDDEN, generator=torch.Generator().manual_seed(1))
    weights = torch.rand(9, 2, generator=torch.Generator().manual_seed(2))
    # Every token on experts 5 (first) and 2; the six other experts get nothing.
    all_on_five = Routing(weights, torch.tensor([[5, 2]] * 9))
    actual = block.experts(hidden, all_on_five)
    torch.testing.assert_close(actual, _naive_experts(block, hidden, all_on_five))
    # Only expert 7 for one token, with top_k 1.
    single = Routing(weights[:1, :1], torch.tensor([[7]]))
    torch.testing.assert_close(
        block.experts(hidden[:1], single), _naive_experts(block, hidden[:1], single)
    )


@torch.no_grad()
def test_no_tokens_gives_an_empty_output():
    block = _block(top_k=2, norm_topk_prob=False)
    empty = torch.empty(0, HIDDEN)
    assert block(empty).shape == (0, HIDDEN)


@torch.no_grad()
def test_bfloat16_stays_close_to_float32():
    block = _block(top_k=2, norm_topk_prob=True)
    hidden = torch.randn(33, HIDDEN, generator=torch.Generator().manual_seed(3))
    routing = block.gate(hidden)
    experts = block.experts
    expected = grouped_experts_forward(
        hidden, routing.weights, routing.expert_ids, experts.gate_up_proj, experts.down_proj
    )
    low = grouped_experts_forward(
        hidden.bfloat16(),
        routing.weights.bfloat16(),
        routing.expert_ids,
        experts.gate_up_proj.bfloat16(),
        experts.down_proj.bfloat16(),
    )
    assert low.dtype == torch.bfloat16
    error = (low.float() - expected).norm() / expected.norm()
    assert error < 2e-2


@torch.no_grad()
def test_router_returns_weights_in_the_hidden_dtype():
    router = TopKRouter(HIDDEN, NUM_EXPERTS, 2, norm_topk_prob=True)
    router.weight.normal_()
    routing = router.to(torch.bfloat16)(torch.randn(4, HIDDEN, dtype=torch.bfloat16))
    assert routing.weights.dtype == torch.bfloat16
    assert routing.expert_ids.dtype == torch.int64 and routing.expert_ids.shape == (4, 2)
