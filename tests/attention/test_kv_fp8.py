"""The float8 KV cache on the CPU: the quantize/dequantize reference, the torch and batched CPU
backends reading a float8 cache, scales from checkpoints and calibration, bad values, and the
engine end to end (tokens that fit, quality against the float32 cache, batching modes)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ladle import LLM, SamplingParams
from ladle.attention.base import write_kv_cache
from ladle.attention.cpu_backend import batched_paged_attention
from ladle.attention.kv_quant import (
    FP8_E4M3_MAX,
    FP8_KV_DTYPE,
    dequantize_kv,
    quantize_kv,
    resolve_kv_cache_dtype,
)
from ladle.attention.torch_backend import paged_attention_reference
from ladle.config import CacheConfig
from ladle.model.loader.errors import ModelLoadError

# Relative L2 error of the last-position logits, fp8 cache against the float32 cache, over six
# prompts on the tiny random models: measured 5.7% (llama) and 5.5% (qwen3), per prompt 3-9%.
# It is e4m3's own rounding: a one-token prompt's attention output is its value row itself,
# rounded to 3 mantissa bits (~3.6% RMS), and a 2-layer, 64-wide model averages little of it
# away. Real shapes: docs/quantization.md.
LOGITS_TOLERANCE = 0.09


def test_quantize_round_trip_error_and_saturation():
    generator = torch.Generator().manual_seed(0)
    for shape in [(1,), (7, 3), (17, 2, 16), (300, 5, 64)]:
        values = torch.randn(*shape, generator=generator) * 3
        scale = torch.tensor([values.abs().max().item() / FP8_E4M3_MAX])
        codes = quantize_kv(values, scale)
        assert codes.dtype == FP8_KV_DTYPE and codes.shape == values.shape
        back = dequantize_kv(codes, scale, torch.float32)
        # e4m3 rounds to 3 mantissa bits: half a step is 2^-4 of the value (normal range), and
        # below 2^-6 * scale the subnormal step 2^-9 * scale bounds the error instead.
        bound = torch.maximum(values.abs() * 2**-4, torch.full_like(values, 2**-10 * scale.item()))
        assert ((back - values).abs() <= bound * 1.0001).all()
    # Past the range: saturated at +-448 * scale, never inf or NaN.
    big = torch.tensor([1e6, -1e6, 448.0, 449.0, 0.0])
    back = dequantize_kv(quantize_kv(big, torch.tensor([1.0])), torch.tensor([1.0]), torch.float32)
    assert back.tolist() == [448.0, -448.0, 448.0, 448.0, 0.0]


def test_resolve_kv_cache_dtype():
    assert resolve_kv_cache_dtype("auto", torch.bfloat16) is torch.bfloat16
    assert resolve_kv_cache_dtype("fp8", torch.float32) is FP8_KV_DTYPE
    assert resolve_kv_cache_dtype("fp8_e4m3", torch.bfloat16) is FP8_KV_DTYPE


@pytest.mark.parametrize("bad", ["fp8_e5m2", "int8", "float8", ""])
def test_unknown_kv_cache_dtype_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="kv_cache_dtype") as error:
        CacheConfig(kv_cache_dtype=bad)
    assert repr(bad) in str(error.value)
    if bad == "fp8_e5m2":
        assert "fp8_e4m3" in str(error.value)
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM("HuggingFaceTB/SmolLM2-135M", load_format="dummy", kv_cache_dtype=bad)


def test_kv_cache_dtype_flag():
    import argparse

    from ladle.cli.engine_args import add_engine_arguments, engine_options_from_args

    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    args = parser.parse_args(["--kv-cache-dtype", "fp8"])
    assert engine_options_from_args(args)["kv_cache_dtype"] == "fp8"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp8_e5m2"])


def _random_step(query_lens, context_lens, block_size, seed, num_kv_heads=2, head_dim=16):
    """A step over a shuffled paged cache (request i: context_lens[i] tokens, its last
    query_lens[i] being this step's rows); the new rows' keys and values to write."""
    from ladle.attention.metadata import AttentionMetadata

    generator = torch.Generator().manual_seed(seed)
    blocks_per_req = [(n + block_size - 1) // block_size for n in context_lens]
    num_blocks = sum(blocks_per_req) + 1
    block_ids = list(range(1, num_blocks))
    random.Random(seed).shuffle(block_ids)
    table = torch.zeros(len(query_lens), max(blocks_per_req), dtype=torch.int32)
    slots, starts, taken = [], [0], 0
    for index, (count, query_len, context_len) in enumerate(
        zip(blocks_per_req, query_lens, context_lens)
    ):
        ids = block_ids[taken : taken + count]
        table[index, :count] = torch.tensor(ids)
        taken += count
        for position in range(context_len - query_len, context_len):
            slots.append(ids[position // block_size] * block_size + position % block_size)
        starts.append(starts[-1] + query_len)
    num_tokens = starts[-1]
    query = torch.randn(num_tokens, 3 * num_kv_heads, head_dim, generator=generator)
    key = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator) * 4
    value = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator)
    old = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=generator)
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(context_lens, dtype=torch.int32),
        block_tables=table,
        max_query_len=max(query_lens),
        max_seq_len=max(context_lens),
        block_size=block_size,
        query_start_loc_host=starts,
        seq_lens_host=list(context_lens),
    )
    return query, key, value, old, metadata


@pytest.mark.parametrize(
    ("query_lens", "context_lens", "block_size"),
    [
        ([1], [1], 16),
        ([1] * 7, [1, 7, 16, 17, 33, 100, 5], 16),  # decodes around the block size
        ([5, 1, 1, 16, 1], [5, 40, 17, 20, 1], 16),  # chunks mixed with decodes
        ([17, 1], [17, 130], 8),
    ],
)
def test_fp8_cache_write_and_attention_match_dequantized_reference(
    query_lens, context_lens, block_size
):
    query, key, value, old, metadata = _random_step(query_lens, context_lens, block_size, seed=5)
    k_scale, v_scale = torch.tensor([4 * 4.5 / FP8_E4M3_MAX]), torch.tensor([0.01])  # v saturates
    scales = (k_scale, v_scale)
    fp8_cache = torch.stack([quantize_kv(old[0], k_scale), quantize_kv(old[1], v_scale)])
    write_kv_cache(key, value, fp8_cache, metadata.slot_mapping, scales)
    # Reference: the same rows written into the dequantized float cache after quantize-dequantize.
    expected = torch.stack(
        [
            dequantize_kv(fp8_cache[0], k_scale, torch.float32),
            dequantize_kv(fp8_cache[1], v_scale, torch.float32),
        ]
    )
    rows = expected.view(2, -1, *key.shape[1:])
    written_key = dequantize_kv(quantize_kv(key, k_scale), k_scale, torch.float32)
    written_value = dequantize_kv(quantize_kv(value, v_scale), v_scale, torch.float32)
    assert torch.equal(rows[0, metadata.slot_mapping], written_key)
    assert torch.equal(rows[1, metadata.slot_mapping], written_value)
    assert (written_value.abs() <= FP8_E4M3_MAX * v_scale.item()).all()
    reference = paged_attention_reference(query, expected, metadata, 0.25)
    torch.testing.assert_close(
        paged_attention_reference(query, fp8_cache, metadata, 0.25, scales), reference
    )
    torch.testing.assert_close(
        batched_paged_attention(query, fp8_cache, metadata, 0.25, scales),
        reference,
        rtol=1e-5,
        atol=1e-5,
    )


def test_write_to_fp8_cache_without_scales_is_an_error():
    query, key, value, old, metadata = _random_step([1], [1], 16, seed=1)
    with pytest.raises(ValueError, match="k_scale, v_scale"):
        write_kv_cache(key, value, old.to(FP8_KV_DTYPE), metadata.slot_mapping)


# ----- the engine on the CPU ----------------------------------------------------------------


def _greedy(max_tokens: int = 8) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def _prompts(count: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(4, 512) for _ in range(n)] for n in (1, 7, 16, 17, 45, 100)[:count]]


def _logits_error(path: str, prompts: list[list[int]]) -> tuple[float, int]:
    """Relative L2 error of the fp8 cache's last-position logits against the float32 cache's,
    over the whole vocabulary, and how many argmaxes agree."""
    results = []
    for kv_cache_dtype in ("auto", "fp8"):
        llm = LLM(path, device="cpu", kv_cache_dtype=kv_cache_dtype, num_kv_blocks=64)
        runner = llm.engine.executor.worker
        assert runner.kv_caches[0].dtype == (
            FP8_KV_DTYPE if kv_cache_dtype == "fp8" else torch.float32
        )
        logits = []
        for prompt in prompts:
            input_ids = torch.tensor(prompt)
            logits.append(_prefill_logits(runner, input_ids))
        results.append(torch.stack(logits))
        del llm
    reference, fp8 = results
    error = ((fp8 - reference).norm() / reference.norm()).item()
    agree = int((fp8.argmax(-1) == reference.argmax(-1)).sum())
    return error, agree


def _prefill_logits(runner, input_ids: torch.Tensor) -> torch.Tensor:
    """The last position's logits of one prompt prefilled into blocks 1.. of the runner's cache
    (its own dtype: float32 or fp8 with the runner's calibrated scales)."""
    from ladle.attention.metadata import AttentionMetadata

    length, block_size = input_ids.shape[0], runner.block_size
    metadata = AttentionMetadata.one_fresh_prompt(length, block_size)
    with torch.inference_mode():
        hidden = runner.model(input_ids, torch.arange(length), runner.kv_caches, metadata)
        return runner.model.compute_logits(hidden[-1:])[0].float()


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_fp8_cache_logits_close_to_float32_cache(tiny_model_path, architecture):
    error, agree = _logits_error(tiny_model_path(architecture), _prompts(6))
    assert error < LOGITS_TOLERANCE, error
    assert agree >= 5


def test_fp8_cache_fits_four_times_the_float32_tokens(tiny_model_path, capsys):
    path = tiny_model_path("llama")
    budgets = {}
    for dtype in ("auto", "fp8"):
        llm = LLM(path, device="cpu", kv_cache_dtype=dtype, cpu_kv_cache_gib=0.01)
        budgets[dtype] = llm.engine.executor.worker.memory_budget
    assert budgets["auto"].kv_cache_bytes // budgets["auto"].num_blocks == 4 * (
        budgets["fp8"].kv_cache_bytes // budgets["fp8"].num_blocks
    )
    assert budgets["fp8"].num_token_slots >= 4 * budgets["auto"].num_token_slots
    assert "in float8_e4m3fn" in budgets["fp8"].describe()
    stderr = capsys.readouterr().err
    assert "fp8 KV cache: 0 layers' k/v scales from the checkpoint, 2 calibrated" in stderr


def test_fp8_cache_batching_modes_agree(tiny_model_path):
    """Chunked prefill, prefix-cache hits and preemption read the same float8 blocks as one
    plain batch: greedy tokens equal the all-together fp8 run's."""
    path = tiny_model_path("qwen2")
    prompts = _prompts(6, seed=11)
    plain = LLM(path, device="cpu", kv_cache_dtype="fp8", enable_prefix_caching=False)
    expected = [
        o.outputs[0].token_ids for o in plain.generate(prompts, _greedy(12), use_tqdm=False)
    ]
    del plain
    for options in (
        {"max_num_batched_tokens": 24},  # chunked prefill beside decodes
        {"num_kv_blocks": 20, "block_size": 8},  # preemption
        {},  # prefix-cache hits on the second pass
    ):
        llm = LLM(path, device="cpu", kv_cache_dtype="fp8", **options)
        for _ in range(2):
            outputs = llm.generate(prompts, _greedy(12), use_tqdm=False)
            assert [o.outputs[0].token_ids for o in outputs] == expected, options
        stats = llm.engine.get_stats()
        if "num_kv_blocks" in options:
            assert stats.num_preemptions > 0


def _with_kv_scales(tmp_path: Path, source: str, scales: dict[str, torch.Tensor]) -> str:
    """A copy of the tiny model whose safetensors also carry `scales`."""
    import shutil

    target = tmp_path / "with_scales"
    shutil.copytree(source, target)
    weights_file = next(target.glob("*.safetensors"))
    tensors = load_file(weights_file)
    tensors.update(scales)
    save_file(tensors, weights_file)
    return str(target)


def test_checkpoint_kv_scales_are_used(tiny_model_path, tmp_path, capsys):
    scales = {}
    for layer in range(2):
        scales[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor(0.02 + layer)
        scales[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor(0.03 + layer)
    path = _with_kv_scales(tmp_path, tiny_model_path("llama"), scales)
    llm = LLM(path, device="cpu", kv_cache_dtype="fp8", num_kv_blocks=16)
    model = llm.engine.executor.worker.model
    layers = [m for m in model.modules() if hasattr(m, "kv_scales_source")]
    assert [float(layer.k_scale) for layer in layers] == pytest.approx([0.02, 1.02])
    assert [float(layer.v_scale) for layer in layers] == pytest.approx([0.03, 1.03])
    assert all(layer.kv_scales_source == "checkpoint" for layer in layers)
    assert "2 layers' k/v scales from the checkpoint;" in capsys.readouterr().err


def test_autofp8_output_scale_names_are_read(tiny_model_path, tmp_path):
    scales = {
        f"model.layers.{layer}.self_attn.{kind}_proj.output_scale": torch.tensor([0.5])
        for layer in range(2)
        for kind in "kv"
    }
    path = _with_kv_scales(tmp_path, tiny_model_path("llama"), scales)
    llm = LLM(path, device="cpu", kv_cache_dtype="fp8", num_kv_blocks=16)
    model = llm.engine.executor.worker.model
    layers = [m for m in model.modules() if hasattr(m, "kv_scales_source")]
    assert [float(layer.v_scale) for layer in layers] == [0.5, 0.5]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (torch.tensor(-1.0), "must be finite and > 0"),
        (torch.tensor(0.0), "must be finite and > 0"),
        (torch.tensor(float("nan")), "must be finite and > 0"),
        (torch.tensor(float("inf")), "must be finite and > 0"),
        (torch.ones(2), r"has shape \(2,\)"),
    ],
)
def test_bad_checkpoint_kv_scale_names_the_tensor(tiny_model_path, tmp_path, value, message):
    name = "model.layers.1.self_attn.k_scale"
    path = _with_kv_scales(tmp_path, tiny_model_path("llama"), {name: value})
    with pytest.raises(ModelLoadError, match=message) as error:
        LLM(path, device="cpu", kv_cache_dtype="fp8", num_kv_blocks=16)
    assert name in str(error.value)


def test_kv_scale_of_a_missing_layer_is_an_error(tiny_model_path, tmp_path):
    name = "model.layers.9.self_attn.v_scale"
    path = _with_kv_scales(tmp_path, tiny_model_path("llama"), {name: torch.tensor(1.0)})
    with pytest.raises(ModelLoadError, match="unexpected weight") as error:
        LLM(path, device="cpu", num_kv_blocks=16)
    assert name in str(error.value)
