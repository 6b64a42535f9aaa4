"""The fused MoE kernels (kernels/fused_moe.py, moe_align*.py) under Triton's interpreter on the
CPU, against the torch experts (layers/moe.py grouped_experts_forward) at small awkward sizes:
tokens 1, 7, 33; top-k 2 and 8; experts nobody chose; every token on one expert; both tile
kinds; fp8 weights with per-channel and 128-wide group scales against the dequantized weights.

Skipped where Triton is not installed (it is not a dependency of the CPU install). The
interpreter runs float32 tensors (numpy has no bfloat16); the real-size bf16 and fp8 runs are in
tests/gpu/test_fused_moe_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers.interpreter import interpreted, parent_only, run_in_interpreter_child

from ladle.kernels.moe_tiles import MoePlan, MoeTile
from ladle.model.layers.moe import grouped_experts_forward
from ladle.model.layers.quant.fp8 import FP8_DTYPE

pytest.importorskip("triton")


@pytest.mark.slow  # ~20 s on a 2-core machine
@parent_only
def test_kernels_under_the_interpreter():
    run_in_interpreter_child(__file__)


@pytest.fixture(scope="module")
def kernels():
    from ladle.kernels import fused_moe, moe_align_kernel

    return {"fused_moe": fused_moe, "moe_align_kernel": moe_align_kernel}


# Rows tiles run a program per assignment: wide column blocks keep the interpreter quick.
ROWS = MoePlan(MoeTile("rows", block_n=64, block_k=32), MoeTile("rows", block_n=32, block_k=16))
GROUPED = MoePlan(
    MoeTile("grouped", block_n=16, block_k=32, block_m=16, group_m=2),
    MoeTile("grouped", block_n=32, block_k=16, block_m=16, group_m=1),
)
MIXED = MoePlan(ROWS.gate_up, GROUPED.down)

HIDDEN, INTERMEDIATE = 64, 48  # 48: a partial column block for block_n 32


def _routing(num_tokens: int, num_experts: int, top_k: int, generator, one_expert=None):
    if one_expert is not None:  # every token's first choice is the same expert
        rest = [e for e in range(num_experts) if e != one_expert]
        ids = [
            [one_expert] + [rest[i] for i in torch.randperm(len(rest), generator=generator)[
                : top_k - 1]]
            for _ in range(num_tokens)
        ]  # fmt: skip
        ids = torch.tensor(ids)
    else:
        # Only the first half of the experts are ever chosen: the rest get zero tokens.
        pool = max(top_k, num_experts // 2)
        ids = torch.stack(
            [torch.randperm(pool, generator=generator)[:top_k] for _ in range(num_tokens)]
        )
    weights = torch.softmax(torch.randn(num_tokens, top_k, generator=generator), dim=-1)
    return weights, ids


def _experts(num_experts: int, generator):
    gate_up = torch.randn(num_experts, 2 * INTERMEDIATE, HIDDEN, generator=generator) / 8
    down = torch.randn(num_experts, HIDDEN, INTERMEDIATE, generator=generator) / 8
    return gate_up, down


@interpreted
@pytest.mark.parametrize("num_tokens", [1, 7, 33])
@pytest.mark.parametrize("top_k,num_experts", [(2, 8), (6, 12), (8, 16)])  # 6: padded slots
@pytest.mark.parametrize("plan", [ROWS, GROUPED, MIXED], ids=["rows", "grouped", "mixed"])
def test_fused_experts_match_the_torch_experts(kernels, num_tokens, top_k, num_experts, plan):
    if plan is not GROUPED and num_tokens * top_k > 64:
        pytest.skip("rows tiles serve small steps (and are slow in the interpreter)")
    generator = torch.Generator().manual_seed(num_tokens * 100 + top_k)
    hidden = torch.randn(num_tokens, HIDDEN, generator=generator)
    weights, ids = _routing(num_tokens, num_experts, top_k, generator)
    gate_up, down = _experts(num_experts, generator)
    expected = grouped_experts_forward(hidden, weights, ids, gate_up, down)
    fused = kernels["fused_moe"]
    got = fused.fused_experts(hidden, weights, ids, fused.ExpertStacks(gate_up, down), plan)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@interpreted
@pytest.mark.parametrize("plan", [ROWS, GROUPED], ids=["rows", "grouped"])
def test_every_token_on_one_expert(kernels, plan):
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(17, HIDDEN, generator=generator)
    weights, ids = _routing(17, 8, 2, generator, one_expert=5)
    gate_up, down = _experts(8, generator)
    expected = grouped_experts_forward(hidden, weights, ids, gate_up, down)
    fused = kernels["fused_moe"]
    got = fused.fused_experts(hidden, weights, ids, fused.ExpertStacks(gate_up, down), plan)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@interpreted
@pytest.mark.parametrize("num_tokens,top_k,block_m", [(1, 8, 16), (7, 2, 16), (33, 8, 32)])
def test_triton_alignment_equals_the_torch_sort(kernels, num_tokens, top_k, block_m):
    from ladle.kernels.moe_align import align_to_expert_blocks_torch, max_padded_rows

    generator = torch.Generator().manual_seed(num_tokens)
    num_experts = 12  # not a power of two: the kernel pads its expert axis
    _, ids = _routing(num_tokens, num_experts, top_k, generator)
    expected = align_to_expert_blocks_torch(ids, num_experts, block_m)
    max_rows = max_padded_rows(ids.numel(), num_experts, block_m)
    got = kernels["moe_align_kernel"].align_with_triton(ids, num_experts, block_m, max_rows)
    assert torch.equal(got.num_rows, expected.num_rows)
    assert torch.equal(got.sorted_ids, expected.sorted_ids)
    used_blocks = int(expected.num_rows) // block_m
    assert torch.equal(got.block_expert[:used_blocks], expected.block_expert[:used_blocks])
    # Every assignment appears once, in a block of its own expert, within the rows in use.
    rows = got.sorted_ids[: int(got.num_rows)]
    real = rows[rows < ids.numel()].long()
    assert sorted(real.tolist()) == list(range(ids.numel()))
    row_expert = got.block_expert.long().repeat_interleave(block_m)[: int(got.num_rows)]
    assert torch.equal(row_expert[rows < ids.numel()], ids.reshape(-1)[real])


def _fp8_per_channel(weight: torch.Tensor):
    scale = weight.abs().amax(dim=-1) / 448.0
    codes = (weight / scale[..., None]).to(FP8_DTYPE)
    return codes, scale, codes.float() * scale[..., None]


def _fp8_groups(weight: torch.Tensor, group: int):
    experts, rows, cols = weight.shape
    grouped = weight.view(experts, rows, cols // group, group)
    scale = grouped.abs().amax(dim=-1) / 448.0
    codes = (grouped / scale[..., None]).to(FP8_DTYPE)
    dequantized = (codes.float() * scale[..., None]).view(experts, rows, cols)
    return codes.view(experts, rows, cols), scale, dequantized


@interpreted
@pytest.mark.parametrize("scales", ["channel", "group"])
@pytest.mark.parametrize("plan", [ROWS, GROUPED], ids=["rows", "grouped"])
def test_fp8_experts_match_their_dequantized_weights(kernels, scales, plan):
    generator = torch.Generator().manual_seed(11)
    num_tokens, top_k, num_experts, hidden_size, intermediate_size = 5, 2, 8, 256, 128
    hidden = torch.randn(num_tokens, hidden_size, generator=generator)
    weights, ids = _routing(num_tokens, num_experts, top_k, generator)
    gate_up = torch.randn(num_experts, 2 * intermediate_size, hidden_size, generator=generator)
    down = torch.randn(num_experts, hidden_size, intermediate_size, generator=generator)
    if scales == "channel":
        gate_up_q, gate_up_scale, gate_up_ref = _fp8_per_channel(gate_up / 16)
        down_q, down_scale, down_ref = _fp8_per_channel(down / 16)
        group = 0
    else:
        group = 128
        gate_up_q, gate_up_scale, gate_up_ref = _fp8_groups(gate_up / 16, group)
        down_q, down_scale, down_ref = _fp8_groups(down / 16, group)
    expected = grouped_experts_forward(hidden, weights, ids, gate_up_ref, down_ref)
    fused = kernels["fused_moe"]
    experts = fused.ExpertStacks(gate_up_q, down_q, gate_up_scale, down_scale, group)
    got = fused.fused_experts(hidden, weights, ids, experts, plan)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@interpreted
def test_grouped_tiles_must_not_straddle_scale_groups(kernels):
    fused = kernels["fused_moe"]
    codes = torch.zeros(2, 8, 256, dtype=FP8_DTYPE)
    experts = fused.ExpertStacks(codes, codes, torch.ones(2, 8, 2), torch.ones(2, 8, 2), 128)
    wide = MoeTile("grouped", block_n=16, block_k=256, block_m=16)
    with pytest.raises(ValueError, match="block_k=256 does not divide the fp8 scale group 128"):
        fused.check_plan_fits(MoePlan(wide, wide), experts)


@interpreted
def test_tuning_keeps_the_fastest_plan_and_caches_it(kernels, tmp_path, monkeypatch):
    """The tuner (kernels/moe_tuning.py) with a stand-in timer that charges each tile a fixed
    price: every bucket gets the cheapest (rows pair, or grouped pair plus alignment) plan,
    the table is written, and the next start-up reads it without timing anything."""
    from ladle.kernels import moe_tuning

    generator = torch.Generator().manual_seed(5)
    gate_up, down = _experts(8, generator)
    stacks = kernels["fused_moe"].ExpertStacks(gate_up, down)
    prices = {"rows n16 k128 w4": 1.0, "grouped m16 n64 k64": 0.2}
    calls = []

    def timer(run):
        calls.append(run)
        name = getattr(run, "__qualname__", "")
        if "align" in name:
            return 0.5  # the alignment
        tile = run.tile.describe()
        return next((p for key, p in prices.items() if tile.startswith(key)), 9.0)

    original = moe_tuning._launchers

    def tagged(stacks_, inputs, tile, blocks):
        runs = original(stacks_, inputs, tile, blocks)
        for run in runs:
            run.tile = tile
        return runs

    monkeypatch.setattr(moe_tuning, "_launchers", tagged)  # each run knows its tile
    result = moe_tuning.tune_tile_table(
        stacks, top_k=2, dtype=torch.float32, max_tokens=2, timer=timer, cache_dir=tmp_path,
        device_name="Test GPU",
    )  # fmt: skip
    assert not result.from_cache and result.table.buckets == (1, 2)
    for plan in result.table.plans:
        # rows pair: 1.0 + 1.0 = 2.0; grouped m16 pair: 0.5 + 0.2 + 0.2 = 0.9.
        assert plan.gate_up.describe().startswith("grouped m16 n64 k64")
        assert plan.down.describe().startswith("grouped m16 n64 k64")
    assert result.timings[1]["chosen"] == pytest.approx(0.9)
    assert result.path.parent == tmp_path and "Test_GPU" in result.path.name
    again = moe_tuning.tune_tile_table(
        stacks, top_k=2, dtype=torch.float32, max_tokens=2, timer=None, cache_dir=tmp_path,
        device_name="Test GPU",
    )  # fmt: skip
    assert again.from_cache and again.table == result.table
    # Another top_k is another shape: not read from this file.
    assert moe_tuning.MoeShape.of(stacks, 4, torch.float32).cache_name("Test GPU", 2) != (
        result.path.name
    )


@interpreted
def test_a_tuned_plan_runs_and_matches_the_reference(kernels):
    """The plans the default table and the tuner's candidates name all run (every candidate tile
    of a small bucket, as the tuner launches them)."""
    from ladle.kernels import moe_tuning

    generator = torch.Generator().manual_seed(8)
    hidden = torch.randn(3, HIDDEN, generator=generator)
    weights, ids = _routing(3, 8, 2, generator)
    gate_up, down = _experts(8, generator)
    expected = grouped_experts_forward(hidden, weights, ids, gate_up, down)
    fused = kernels["fused_moe"]
    stacks = fused.ExpertStacks(gate_up, down)
    shape = moe_tuning.MoeShape.of(stacks, 2, torch.float32)
    rows = moe_tuning.rows_candidates(3)
    grouped = moe_tuning.grouped_candidates(3, shape, 0)
    assert rows and grouped and {t.block_m for t in grouped} == {16}
    for gate_up_tile, down_tile in [(rows[0], rows[-1]), (grouped[0], grouped[-1])]:
        plan = MoePlan(gate_up_tile, down_tile)
        got = fused.fused_experts(hidden, weights, ids, stacks, plan)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@interpreted
@pytest.mark.parametrize(
    "num_tokens,num_experts,top_k,renormalize",
    [(1, 8, 2, True), (7, 12, 8, False), (33, 16, 8, True), (33, 8, 2, False)],
)
def test_fused_routing_matches_the_torch_router(num_tokens, num_experts, top_k, renormalize):
    """kernels/moe_routing.py against TopKRouter's torch routing (float32 softmax, top-k,
    renormalisation), and its counts against a bincount of the ids it chose."""
    from ladle.kernels.moe_routing import topk_softmax
    from ladle.model.layers.moe import TopKRouter

    generator = torch.Generator().manual_seed(num_tokens * num_experts)
    logits = torch.randn(num_tokens, num_experts, generator=generator) * 3
    router = TopKRouter(4, num_experts, top_k, renormalize)
    expected = router.route(logits, torch.float32)
    counts = torch.full((num_experts,), 5, dtype=torch.int64)
    weights, ids = topk_softmax(logits, top_k, renormalize, torch.float32, counts)
    assert torch.equal(ids, expected.expert_ids)
    torch.testing.assert_close(weights, expected.weights, rtol=1e-6, atol=1e-7)
    assert torch.equal(counts - 5, torch.bincount(ids.reshape(-1), minlength=num_experts))


def test_the_untuned_table_fits_narrow_fp8_groups():
    from ladle.kernels.moe_tiles import DEFAULT_TABLE, default_table

    assert default_table(0) is DEFAULT_TABLE and default_table(128) is DEFAULT_TABLE
    narrow = default_table(32)
    assert all(
        tile.block_k == 32
        for plan in narrow.plans
        for tile in (plan.gate_up, plan.down)
        if tile.kind == "grouped"
    )
