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
