"""The CPU's one-call decode stack (model/models/llama_decode_stack.py, decode_stack.c): the same
logits and KV cache as the layer-by-layer path bit for bit, over several decode steps at batch 1
and 3, HF transformers' float32 logits (on the dequantized 4-bit weights) within the 16-bit
activation path's tolerance, and in the engine with prefix-cache hits and preemption."""

from __future__ import annotations

import pytest
import torch

from ladle.kernels.cpu_native.build import native_library
from ladle.kernels.cpu_native.decode_stack import DecodeStackWeights
from ladle.model.layers.group_quant import quantize_int4_groups
from ladle.model.layers.linear import Linear
from ladle.model.layers.quantized_linear import set_group_quantized_weight_
from ladle.model.models import llama_decode_stack

pytestmark = pytest.mark.skipif(native_library() is None, reason="no C compiler for the kernels")

# Sizes the 4-bit kernel takes (every K a multiple of 64) but otherwise awkward: 3 query heads
# per kv head (as the default model), 640 gate_up rows, 3 layers.
SHAPE = dict(
    hidden_size=192,
    intermediate_size=320,
    num_hidden_layers=3,
    num_attention_heads=6,
    num_key_value_heads=2,
    head_dim=32,
)
# The 16-bit activation path against HF's float32 on the same (dequantized) weights: the
# activations carry ~5 significant digits into each matmul (the plain-C build rounds them a
# little differently from the AVX-512 one: 3e-3 seen).
HF_TOLERANCE = dict(rtol=2e-3, atol=5e-3)


class CountedCalls:
    """Counts the decode stack's C calls that returned a result."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = DecodeStackWeights.call

        def call(weights, *args, **kwargs):
            result = original(weights, *args, **kwargs)
            self.count += result is not None
            return result

        monkeypatch.setattr(DecodeStackWeights, "call", call)


def quantize_projections_(model: torch.nn.Module) -> None:
    """Every Linear (the decoder's projections) to 4-bit groups of 32 with offsets (the layout
    of GGUF's Q4_1)."""
    for module in model.modules():
        if isinstance(module, Linear) and module.weight is not None:
            set_group_quantized_weight_(module, quantize_int4_groups(module.weight.data, 32))


@torch.no_grad()
def dequantized_hf_reference(path: str, ladle_model: torch.nn.Module):
    """HF's model with each projection set to the dequantized 4-bit weight ladle runs."""
    from helpers.tiny_models import load_hf_reference

    reference = load_hf_reference(path)
    for index, layer in enumerate(ladle_model.model.layers):
        hf_layer = reference.model.layers[index]
        attention = layer.self_attn
        qkv = attention.qkv_proj.quantized_weight.dequantize()
        q, k, v = qkv.split([attention.qkv_proj.q_size, *[attention.qkv_proj.kv_size] * 2])
        gate, up = layer.mlp.gate_up_proj.quantized_weight.dequantize().chunk(2)
        new_weights = {
            hf_layer.self_attn.q_proj: q,
            hf_layer.self_attn.k_proj: k,
            hf_layer.self_attn.v_proj: v,
            hf_layer.self_attn.o_proj: attention.o_proj.quantized_weight.dequantize(),
            hf_layer.mlp.gate_proj: gate,
            hf_layer.mlp.up_proj: up,
            hf_layer.mlp.down_proj: layer.mlp.down_proj.quantized_weight.dequantize(),
        }
        for module, weight in new_weights.items():
            module.weight.copy_(weight)
    return reference


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_q4(request, tmp_path_factory):
    """(path, ladle model with 4-bit projections, HF reference on the same weights); qwen2 has
    q/k/v biases."""
    from helpers.tiny_models import save_tiny_model

    from ladle.attention.cpu_backend import CpuAttentionBackend
    from ladle.config import ModelConfig
    from ladle.model.loader import load_model

    path = save_tiny_model(tmp_path_factory.mktemp("decode_stack"), request.param, **SHAPE)
    loaded = load_model(
        ModelConfig(model=path), torch.device("cpu"), torch.float32, CpuAttentionBackend()
    )
    quantize_projections_(loaded.model)
    return path, loaded, dequantized_hf_reference(path, loaded.model)


@torch.no_grad()
def run_steps(loaded, sequences: list[list[int]], num_steps: int, enabled: bool):
    """Prefill every sequence in one step, then num_steps decode steps of every sequence
    (greedy); returns each decode step's input ids and logits, and the final caches."""
    from helpers.tiny_models import PagedBatch, make_kv_caches

    batch = PagedBatch(len(sequences), block_size=4, num_blocks=64, seed=3)
    caches = make_kv_caches(loaded.arch_config, 64, 4)
    model = loaded.model
    previous = llama_decode_stack.set_decode_stack(enabled)
    try:
        input_ids, positions, metadata = batch.step(sequences)
        hidden = model(input_ids, positions, caches, metadata)
        last_rows = metadata.query_start_loc[1:].long() - 1
        next_ids = model.compute_logits(hidden[last_rows]).argmax(-1).tolist()
        step_inputs, step_logits = [], []
        for _ in range(num_steps):
            step_inputs.append(next_ids)
            input_ids, positions, metadata = batch.step([[token] for token in next_ids])
            logits = model.compute_logits(model(input_ids, positions, caches, metadata))
            step_logits.append(logits)
            next_ids = logits.argmax(-1).tolist()
    finally:
        llama_decode_stack.set_decode_stack(previous)
    return step_inputs, step_logits, caches


@pytest.mark.parametrize("lengths", [[9], [5, 17, 1]], ids=["batch1", "batch3"])
def test_decode_stack_equals_layer_path_and_hf(tiny_q4, lengths, monkeypatch) -> None:
    path, loaded, reference = tiny_q4
    generator = torch.Generator().manual_seed(len(lengths))
    sequences = [torch.randint(3, 200, (n,), generator=generator).tolist() for n in lengths]
    counted = CountedCalls(monkeypatch)
    inputs, fused_logits, fused_caches = run_steps(loaded, sequences, num_steps=6, enabled=True)
    assert counted.count == 6  # every decode step took the one C call, the prefill did not
    _, layer_logits, layer_caches = run_steps(loaded, sequences, num_steps=6, enabled=False)
    assert counted.count == 6
    for fused, layered in zip(fused_logits, layer_logits, strict=True):
        assert torch.equal(fused, layered)
    for fused, layered in zip(fused_caches, layer_caches, strict=True):
        assert torch.equal(fused, layered)
    # HF on each sequence's whole text so far, its last position, after every step.
    with torch.no_grad():
        for step, logits in enumerate(fused_logits):
            for row, sequence in enumerate(sequences):
                context = sequence + [ids[row] for ids in inputs[: step + 1]]
                expected = reference(torch.tensor([context])).logits[0, -1]
                torch.testing.assert_close(logits[row], expected, **HF_TOLERANCE)


def test_model_outside_the_kernel_keeps_the_layer_path(tiny_q4, monkeypatch) -> None:
    # Float weights (and one mixed model) are not taken: the step runs the layers.
    from ladle.attention.cpu_backend import CpuAttentionBackend
    from ladle.config import ModelConfig
    from ladle.model.loader import load_model

    path, _, _ = tiny_q4
    loaded = load_model(
        ModelConfig(model=path), torch.device("cpu"), torch.float32, CpuAttentionBackend()
    )
    counted = CountedCalls(monkeypatch)
    run_steps(loaded, [[5, 6, 7]], num_steps=2, enabled=True)
    quantize_projections_(loaded.model.model.layers[0])  # layer 0 only: still mixed
    loaded.model.model.__dict__.pop("_cpu_decode_stack", None)
    run_steps(loaded, [[5, 6, 7]], num_steps=2, enabled=True)
    assert counted.count == 0


def test_engine_with_prefix_hits_and_preemption_matches_the_layer_path(
    tiny_q4, monkeypatch
) -> None:
    from ladle import LLM, SamplingParams

    path = tiny_q4[0]
    generator = torch.Generator().manual_seed(7)
    shared = torch.randint(3, 200, (12,), generator=generator).tolist()
    prompts = [shared + torch.randint(3, 200, (n,), generator=generator).tolist() for n in (3, 9)]
    prompts += [torch.randint(3, 200, (n,), generator=generator).tolist() for n in (1, 14, 6)]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=3)
    results = {}
    for enabled in (True, False):
        previous = llama_decode_stack.set_decode_stack(enabled)
        try:
            # 13 usable blocks of 4 tokens: five requests of up to 24 tokens cannot all run.
            llm = LLM(path, block_size=4, num_kv_blocks=14, async_scheduling=False)
            quantize_projections_(llm.engine.executor.worker.model)
            counted = CountedCalls(monkeypatch)
            llm.generate(prompts[:1], params, use_tqdm=False)  # fills the shared prefix
            outputs = llm.generate(prompts, params, use_tqdm=False)
            stats = llm.engine.get_stats()
        finally:
            llama_decode_stack.set_decode_stack(previous)
        assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
        assert (counted.count > 0) == enabled
        results[enabled] = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outputs]
    assert results[True] == results[False]


@torch.no_grad()
def test_verify_steps_run_as_decode_rows_and_match_hf(tiny_q4, monkeypatch) -> None:
    """A step that brings several new tokens per request after cached context (speculative
    decoding's verify step) takes the one C call, one decode row per token: every row's logits
    match HF on the text up to that token, and the layer path's within the same tolerance."""
    from helpers.tiny_models import PagedBatch, make_kv_caches

    path, loaded, reference = tiny_q4
    generator = torch.Generator().manual_seed(11)
    sequences = [torch.randint(3, 200, (n,), generator=generator).tolist() for n in (6, 13, 2)]
    news = [torch.randint(3, 200, (n,), generator=generator).tolist() for n in (3, 1, 5)]
    model = loaded.model
    results = {}
    for enabled in (True, False):
        counted = CountedCalls(monkeypatch)
        batch = PagedBatch(len(sequences), block_size=4, num_blocks=64, seed=3)
        caches = make_kv_caches(loaded.arch_config, 64, 4)
        previous = llama_decode_stack.set_decode_stack(enabled)
        try:
            input_ids, positions, metadata = batch.step(sequences)
            model(input_ids, positions, caches, metadata)
            input_ids, positions, metadata = batch.step(news)
            results[enabled] = model.compute_logits(model(input_ids, positions, caches, metadata))
        finally:
            llama_decode_stack.set_decode_stack(previous)
        assert counted.count == (1 if enabled else 0)
    torch.testing.assert_close(results[True], results[False], **HF_TOLERANCE)
    row = 0
    for sequence, new in zip(sequences, news):
        for j in range(len(new)):
            context = sequence + new[: j + 1]
            expected = reference(torch.tensor([context])).logits[0, -1]
            torch.testing.assert_close(results[True][row], expected, **HF_TOLERANCE)
            row += 1


def test_as_decode_rows_keeps_prompt_starts_and_long_chunks_on_the_layers() -> None:
    from ladle.attention.metadata import AttentionMetadata

    def metadata(query_lens, seq_lens):
        starts = [0]
        for length in query_lens:
            starts.append(starts[-1] + length)
        return AttentionMetadata(
            slot_mapping=torch.arange(starts[-1]),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=torch.arange(len(seq_lens) * 4, dtype=torch.int32).view(-1, 4),
            max_query_len=max(query_lens), max_seq_len=max(seq_lens), block_size=4,
            query_start_loc_host=starts, seq_lens_host=seq_lens,
        )

    rows = llama_decode_stack.as_decode_rows(metadata([3, 1], [10, 7]), 4)
    assert rows.seq_lens_host == [8, 9, 10, 7]
    assert rows.block_tables[:, 0].tolist() == [0, 0, 0, 4]
    assert llama_decode_stack.as_decode_rows(metadata([3, 1], [3, 7]), 4) is None  # a prompt
    assert llama_decode_stack.as_decode_rows(metadata([18], [40]), 18) is None  # a long chunk


def test_engine_with_speculation_gives_the_tokens_without(tiny_q4, monkeypatch) -> None:
    """Greedy tokens with drafts verified through the one C call equal those of one-token steps
    (the decode stack on in both). The drafts are the reference run's next tokens with every
    fourth one wrong, so runs of them are accepted and some are rejected.

    Five prompts, so every decode step has 5 rows or more in both runs: the AVX2 build's GEMM
    takes its interleaved path from 5 rows of x and a row-tile path below, whose sums round
    differently (both within the reference's tolerance), and the tiny model's greedy tokens
    hold near-ties that the difference can flip. From 5 rows on it is batch-invariant (the
    AVX-512 VNNI build from 2)."""
    from ladle import LLM, SamplingParams

    path = tiny_q4[0]
    generator = torch.Generator().manual_seed(5)
    lengths = (2, 7, 12, 4, 9)
    prompts = [torch.randint(3, 200, (n,), generator=generator).tolist() for n in lengths]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    llm = LLM(path, block_size=4, async_scheduling=False)
    quantize_projections_(llm.engine.executor.worker.model)
    inputs = [{"prompt_token_ids": prompt} for prompt in prompts]
    reference = [list(o.outputs[0].token_ids) for o in llm.generate(inputs, params, use_tqdm=False)]
    known = {tuple(prompt): tokens for prompt, tokens in zip(prompts, reference)}

    class KnownTokens:
        num_proposed = 0

        def propose(self, request, max_num_tokens):
            start = request.num_output_tokens
            drafts = known[tuple(request.prompt_token_ids)][start : start + min(4, max_num_tokens)]
            if len(drafts) == 4:
                drafts[3] = (drafts[3] + 1) % 200
            self.num_proposed += len(drafts)
            return drafts

    proposer = llm.engine.scheduler.proposer = KnownTokens()
    counted = CountedCalls(monkeypatch)
    expanded = []
    original = llama_decode_stack.as_decode_rows

    def counting_as_decode_rows(metadata, num_rows):
        rows = original(metadata, num_rows)
        expanded.append(rows is not None)
        return rows

    monkeypatch.setattr(llama_decode_stack, "as_decode_rows", counting_as_decode_rows)
    try:
        outputs = llm.generate(inputs, params, use_tqdm=False)
    finally:
        llm.engine.scheduler.proposer = None
    assert [list(o.outputs[0].token_ids) for o in outputs] == reference
    assert proposer.num_proposed > 30
    # Every verify step ran as decode rows through the C call (the prompts' steps did not).
    assert sum(expanded) >= 5 and counted.count >= sum(expanded)
