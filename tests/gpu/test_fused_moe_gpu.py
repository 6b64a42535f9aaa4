"""The fused MoE path on CUDA (kernels/fused_moe.py), at real sizes and through the engine.

Kernels: one Qwen3-30B-A3B layer's shapes (128 experts, hidden 2048, expert width 768, top-8),
tokens 1, 7 and 513, bf16 and fp8 (per channel, 128-wide groups), every tile kind and both
alignments, against the torch experts in float32 on the same (bf16-rounded, or dequantized)
weights; every token on one expert; a CUDA graph replayed on new routing; the start-up tuner on
this shape, then its cache.
Engine: tiny Qwen3-MoE and Mixtral in bf16 with CUDA graphs on, greedy tokens teacher-forced
against transformers in float32, and the model's logits fused against the torch path; no
Triton build once serving.
"""

from __future__ import annotations

import random

import pytest
import torch

from ladle import LLM, SamplingParams
from ladle.kernels.moe_tiles import ExpertStacks, MoePlan, MoeTile
from ladle.model.layers.moe import StackedExperts, grouped_experts_forward
from ladle.model.layers.quant.fp8 import quantize_fp8_per_row
from ladle.model.layers.quant.fp8_block import expand_groups, quantize_fp8_blocks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

NUM_EXPERTS, HIDDEN, INTERMEDIATE, TOP_K = 128, 2048, 768, 8
# bf16 inputs and outputs and a bf16 intermediate: ~0.3% relative L2 against float32 seen as
# typical for such GEMM chains; 1% leaves room and still catches a wrong row or expert.
RELATIVE_TOLERANCE = 1e-2

ROWS = MoePlan(MoeTile("rows", 16, 256), MoeTile("rows", 16, 256))
GROUPED_16 = MoePlan(
    MoeTile("grouped", 64, 128, block_m=16, group_m=4, num_stages=4),
    MoeTile("grouped", 128, 128, block_m=16, group_m=4),
    align="triton",
)
GROUPED_64 = MoePlan(
    MoeTile("grouped", 128, 64, block_m=64, group_m=8),
    MoeTile("grouped", 64, 64, block_m=64, group_m=8, num_stages=4),
    align="torch",
)


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.float() - expected).norm() / expected.norm())


@pytest.fixture(scope="module")
def layer():
    generator = torch.Generator(device="cuda").manual_seed(0)
    # std 0.02 as the dummy weights: the outputs are O(0.1), far from bf16's subnormals.
    gate_up = torch.randn(NUM_EXPERTS, 2 * INTERMEDIATE, HIDDEN, device="cuda",
                          generator=generator) * 0.02  # fmt: skip
    down = torch.randn(NUM_EXPERTS, HIDDEN, INTERMEDIATE, device="cuda", generator=generator)
    down *= 0.02
    return gate_up, down


def _weights(layer, fmt: str):
    """(ExpertStacks for the kernel, float32 stacks for the reference)."""
    gate_up, down = layer
    if fmt == "bf16":
        gate_up, down = gate_up.bfloat16(), down.bfloat16()
        return ExpertStacks(gate_up, down), (gate_up.float(), down.float())
    codes, scales, reference = [], [], []
    for stack in (gate_up, down):
        if fmt == "fp8-channel":
            pairs = [quantize_fp8_per_row(matrix) for matrix in stack]
            full = [s[:, None] for _, s in pairs]
        else:
            pairs = [quantize_fp8_blocks(matrix, 128, 128) for matrix in stack]
            full = [expand_groups(s, stack.shape[-1], 128) for _, s in pairs]
        codes.append(torch.stack([c for c, _ in pairs]))
        scales.append(torch.stack([s for _, s in pairs]))
        reference.append(codes[-1].float() * torch.stack(full))
    group = 128 if fmt == "fp8-group" else 0
    return ExpertStacks(codes[0], codes[1], scales[0], scales[1], group), tuple(reference)


def _routing(num_tokens: int, seed: int, one_expert: int | None = None):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.rand(num_tokens, NUM_EXPERTS, device="cuda", generator=generator)
    if one_expert is not None:
        scores[:, one_expert] = 2.0  # everyone's first choice
    top = scores.topk(TOP_K, dim=-1)
    return torch.softmax(top.values, dim=-1).bfloat16(), top.indices


def _check(stacks, reference, num_tokens, plan, seed=1, one_expert=None):
    from ladle.kernels.fused_moe import fused_experts

    hidden = torch.randn(num_tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)
    weights, ids = _routing(num_tokens, seed, one_expert)
    got = fused_experts(hidden, weights, ids, stacks, plan)
    expected = grouped_experts_forward(hidden.float(), weights.float(), ids, *reference)
    assert got.dtype == torch.bfloat16 and got.shape == (num_tokens, HIDDEN)
    assert _relative_error(got, expected) < RELATIVE_TOLERANCE


@pytest.mark.parametrize("fmt", ["bf16", "fp8-channel", "fp8-group"])
@pytest.mark.parametrize("num_tokens", [1, 7, 513])
def test_real_size_kernels_match_the_torch_experts(layer, fmt, num_tokens):
    stacks, reference = _weights(layer, fmt)
    plans = [GROUPED_16, GROUPED_64] + ([ROWS] if num_tokens <= 7 else [])
    for plan in plans:
        _check(stacks, reference, num_tokens, plan)


@pytest.mark.parametrize("plan", [GROUPED_16, GROUPED_64], ids=["m16-triton", "m64-torch"])
def test_every_token_on_one_expert(layer, plan):
    stacks, reference = _weights(layer, "bf16")
    _check(stacks, reference, 513, plan, seed=4, one_expert=77)


def test_the_fused_path_replays_in_a_cuda_graph(layer):
    """Fixed shapes and no host sync: captured once, replayed on new routing and inputs."""
    from ladle.kernels.fused_moe import fused_experts

    stacks, reference = _weights(layer, "bf16")
    hidden = torch.randn(7, HIDDEN, device="cuda", dtype=torch.bfloat16)
    weights, ids = _routing(7, seed=5)
    for plan in (ROWS, GROUPED_16, GROUPED_64):
        fused_experts(hidden, weights, ids, stacks, plan)  # builds outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused_experts(hidden, weights, ids, stacks, plan)
        new_weights, new_ids = _routing(7, seed=6)
        hidden.copy_(torch.randn_like(hidden))
        weights.copy_(new_weights)
        ids.copy_(new_ids)
        graph.replay()
        expected = grouped_experts_forward(hidden.float(), weights.float(), ids, *reference)
        assert _relative_error(out, expected) < RELATIVE_TOLERANCE


@pytest.mark.parametrize("renormalize", [True, False])
def test_fused_routing_matches_the_torch_router(renormalize):
    from ladle.kernels.moe_routing import topk_softmax
    from ladle.model.layers.moe import TopKRouter

    logits = torch.randn(513, NUM_EXPERTS, device="cuda", dtype=torch.bfloat16) * 2
    router = TopKRouter(HIDDEN, NUM_EXPERTS, TOP_K, renormalize)
    expected = router.route(logits, torch.bfloat16)
    counts = torch.zeros(NUM_EXPERTS, dtype=torch.int64, device="cuda")
    weights, ids = topk_softmax(logits, TOP_K, renormalize, torch.bfloat16, counts)
    # bf16 logits tie often (about 30% of these rows have equal values among their top 9), and
    # torch's CUDA topk breaks ties in its own order: the fused picks must be a top-k in
    # descending order (each pick's probability the k-th largest), distinct experts per row.
    probabilities = torch.softmax(logits, dim=-1, dtype=torch.float32)
    torch.testing.assert_close(
        probabilities.gather(1, ids), probabilities.topk(TOP_K, dim=-1).values, rtol=0, atol=0
    )
    assert all(len(set(row)) == TOP_K for row in ids.tolist())
    # Tied picks carry equal weights, so the weights compare slot by slot.
    torch.testing.assert_close(weights.float(), expected.weights.float(), rtol=1e-2, atol=1e-3)
    assert torch.equal(counts, torch.bincount(ids.reshape(-1), minlength=NUM_EXPERTS))


def test_tuner_on_the_real_shape_then_its_cache(layer, tmp_path):
    from ladle.kernels.moe_tuning import tune_tile_table

    stacks, reference = _weights(layer, "bf16")
    tuned = tune_tile_table(stacks, TOP_K, torch.bfloat16, max_tokens=512, cache_dir=tmp_path)
    print(f"tuned in {tuned.seconds:.1f} s:", [p for p in tuned.table.plans])
    assert not tuned.from_cache and tuned.table.buckets[-1] == 512
    for bucket in (1, 8, 512):
        _check(stacks, reference, bucket, tuned.table.plan_for(bucket))
    cached = tune_tile_table(stacks, TOP_K, torch.bfloat16, max_tokens=512, cache_dir=tmp_path)
    assert cached.from_cache and cached.table == tuned.table and cached.seconds < 1.0


# ----- through the engine ------------------------------------------------------------------

GPU_MOE_SHAPE = dict(
    hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
    intermediate_size=512,
)  # fmt: skip
MOE_WIDTH = {"qwen3_moe": dict(moe_intermediate_size=128), "mixtral": dict(intermediate_size=128)}
NUM_NEW_TOKENS = 16
# Of the row's logit range. The dense models' check (tests/gpu/test_gpu_parity.py) takes 0.02; a
# bf16 router may also pick another expert than fp32 where two are nearly tied, which moves
# that token's logits further by an amount that is not bounded by the arithmetic's precision,
# so 0.06 here (one Qwen3-MoE token measured 0.0513 once the batch-1 router became the GEMV and
# the rows down kernel summed its experts as a tree), with most tokens required to be the fp32
# argmax.
TOKEN_TOLERANCE = 0.06
MIN_ARGMAX_SHARE = 0.9


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral"])
def tiny_moe(request, tmp_path_factory):
    from helpers.tiny_models import load_hf_reference, save_tiny_model

    shape = {**GPU_MOE_SHAPE, **MOE_WIDTH[request.param]}
    path = save_tiny_model(tmp_path_factory.mktemp(request.param), request.param, **shape)
    reference = load_hf_reference(path).to("cuda")
    rng = random.Random(3)
    vocab = reference.config.vocab_size
    prompts = [[rng.randrange(4, vocab) for _ in range(n)] for n in (1, 3, 7, 16, 33, 90)]
    llm = LLM(path, dtype="bfloat16", num_kv_blocks=2048, max_num_batched_tokens=512)
    return llm, reference, prompts


def test_engine_runs_the_fused_path_with_graphs_near_fp32(tiny_moe):
    llm, reference, prompts = tiny_moe
    worker = llm.engine.executor.worker
    assert worker.uses_graphs and worker.fused_moe is not None
    graph_steps = llm.engine.executor.num_graph_steps
    params = SamplingParams(temperature=0.0, max_tokens=NUM_NEW_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.executor.num_graph_steps > graph_steps  # decodes replayed graphs
    num_argmax = 0
    for prompt, output in zip(prompts, outputs, strict=True):
        generated = output.outputs[0].token_ids
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + generated], device="cuda")).logits[0].float()
        rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(generated)]
        chosen = rows[torch.arange(len(generated)), torch.tensor(generated, device="cuda")]
        best = rows.max(dim=-1).values
        gap = (best - chosen) / (best - rows.min(dim=-1).values)
        assert float(gap.max()) <= TOKEN_TOLERANCE, gap.tolist()
        num_argmax += int((gap == 0).sum())
    assert num_argmax >= MIN_ARGMAX_SHARE * NUM_NEW_TOKENS * len(prompts)
    assert sum(llm.engine.executor.worker.expert_load.read(wait=True)) > 0


def test_engine_fused_logits_match_the_torch_path(tiny_moe, monkeypatch):
    from helpers.tiny_models import PagedBatch, make_kv_caches

    llm, _, prompts = tiny_moe
    worker = llm.engine.executor.worker
    batch = PagedBatch(num_seqs=len(prompts), block_size=16, num_blocks=64)
    input_ids, positions, metadata = batch.step(prompts, device="cuda")
    caches = make_kv_caches(worker.arch, 64, 16, torch.bfloat16, "cuda")
    with torch.no_grad():
        fused = worker.model.compute_logits(worker.model(input_ids, positions, caches, metadata))
        # Only the experts change path: every other fused kernel stays as it was.
        monkeypatch.setattr(StackedExperts, "can_run_fused", lambda self: False)
        plain = worker.model.compute_logits(worker.model(input_ids, positions, caches, metadata))
    # Both bf16; the torch path rounds each expert's output to bf16 and sums the top-k in bf16,
    # the kernel sums in float32: a few tenths of a percent apart.
    assert _relative_error(fused, plain.float()) < 2 * RELATIVE_TOLERANCE


def test_no_triton_build_while_serving_a_moe_model(tiny_moe):
    from ladle.kernels.compile_log import compile_totals, start_compile_log

    llm, _, _ = tiny_moe
    assert start_compile_log()
    rng = random.Random(9)
    prompts = [[rng.randrange(4, 500) for _ in range(rng.randrange(1, 300))] for _ in range(40)]
    params = [
        SamplingParams(temperature=0.6, max_tokens=rng.randrange(1, 40), ignore_eos=True, seed=i)
        for i in range(40)
    ]
    before = compile_totals()
    llm.generate(prompts, params, use_tqdm=False)
    built = compile_totals().since(before)
    assert built.num_builds == 0, f"built while serving: {built.names}"
