"""ladle's C decode ops (kernels/cpu_native/decode_ops.py) against their torch references, and a
tiny random model decoding the same greedy tokens with the C kernels on and off."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from ladle.kernels.cpu_native.build import native_library, set_native_kernels
from ladle.kernels.cpu_native.decode_ops import (
    add_rms_norm,
    paged_decode_attention,
    silu_and_mul,
)

pytestmark = pytest.mark.skipif(native_library() is None, reason="no C compiler here")


@pytest.mark.parametrize("shape", [(1, 1), (1, 576), (7, 30), (2, 3, 64), (64, 576)])
def test_add_rms_norm_matches_formula(shape):
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(*shape, generator=generator) * 30
    residual = torch.randn(*shape, generator=generator)
    weight = torch.randn(shape[-1], generator=generator)
    total = x + residual

    def formula(values):
        return weight * values * torch.rsqrt(values.pow(2).mean(-1, keepdim=True) + 1e-5)

    torch.testing.assert_close(add_rms_norm(x, None, weight, 1e-5), formula(x))
    normed, new_residual = add_rms_norm(x, residual, weight, 1e-5)
    assert new_residual is residual  # updated in place
    torch.testing.assert_close(new_residual, total)
    torch.testing.assert_close(normed, formula(total))


def test_ops_decline_other_dtypes_and_layouts():
    weight = torch.ones(8)
    assert add_rms_norm(torch.randn(2, 8).bfloat16(), None, weight, 1e-6) is None
    assert add_rms_norm(torch.randn(8, 2).T, None, weight, 1e-6) is None  # not contiguous
    assert silu_and_mul(torch.randn(3, 7)) is None  # odd width
    assert silu_and_mul(torch.randn(65, 8)) is None  # past batch-sized: torch's ops
    assert add_rms_norm(torch.randn(65, 8), None, weight, 1e-6) is None


@pytest.mark.parametrize("shape", [(1, 2), (7, 30), (2, 3, 3072), (64, 3072)])
def test_silu_and_mul_matches_torch(shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(shape[-1])) * 4
    # the exponential's ends: large gates of both signs, exact zero, past float32's e^-87
    x.view(-1, shape[-1])[0, : min(5, shape[-1] // 2)] = torch.tensor([-100.0, 90, 0, -30, 30])[
        : min(5, shape[-1] // 2)
    ]
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(silu_and_mul(x), F.silu(gate) * up)


@pytest.mark.parametrize(
    ("lengths", "num_heads", "num_kv_heads", "head_dim"),
    # The last is enough work to be shared out between threads.
    [
        ([1], 9, 3, 64),
        ([1, 7, 16, 17, 100], 6, 2, 16),
        ([33, 5], 4, 4, 7),
        ([300, 1, 250], 9, 3, 64),
        # past the kernel's chunk of 128 positions; groups of more than its 8 heads at once
        ([129, 256, 3], 20, 2, 32),
        ([40, 2], 9, 1, 64),
    ],
)
def test_paged_decode_attention_matches_sdpa(lengths, num_heads, num_kv_heads, head_dim):
    generator = torch.Generator().manual_seed(len(lengths))
    block_size, max_context = 16, max(lengths)
    num_slots = block_size * (sum(-(-n // block_size) for n in lengths) + 1)
    kv_cache = torch.randn(2, num_slots // block_size, block_size, num_kv_heads, head_dim)
    # Each request's context scattered over the cache; padding slots point anywhere valid.
    slot_order = list(range(block_size, num_slots))
    random.Random(0).shuffle(slot_order)
    slots = torch.zeros(len(lengths), max_context, dtype=torch.long)
    taken = 0
    for row, length in enumerate(lengths):
        slots[row, :length] = torch.tensor(slot_order[taken : taken + length])
        taken += length
    query = torch.randn(len(lengths), num_heads, head_dim, generator=generator)
    output = paged_decode_attention(
        query, kv_cache, slots.flatten(), torch.tensor(lengths), max_context, scale=0.3
    )
    flat = kv_cache.view(2, -1, num_kv_heads, head_dim)
    for row, length in enumerate(lengths):
        keys = flat[0, slots[row, :length]].transpose(0, 1)  # [kv_heads, length, dim]
        values = flat[1, slots[row, :length]].transpose(0, 1)
        expected = F.scaled_dot_product_attention(
            query[row].unsqueeze(1), keys, values, scale=0.3, enable_gqa=True
        ).squeeze(1)
        torch.testing.assert_close(output[row], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("quantization", ["none", "int8", "int4"])
def test_tiny_model_decodes_the_same_tokens_with_and_without_c_kernels(
    tiny_model_path, quantization
):
    from ladle import LLM, SamplingParams

    llm = LLM(tiny_model_path("llama"), quantization=quantization, max_model_len=256)
    prompts = [[5, 17, 42], [100, 7], [9] * 20]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    tokens = {}
    for native in (True, False):
        previous = set_native_kernels(native)
        try:
            # One at a time (the batch-1 path) and all together (batched decode rows).
            alone = [llm.generate([p], params, use_tqdm=False)[0] for p in prompts]
            together = llm.generate(prompts, params, use_tqdm=False)
        finally:
            set_native_kernels(previous)
        llm.engine.kv_cache_manager.reset_prefix_cache()
        tokens[native] = [list(o.outputs[0].token_ids) for o in alone + together]
    assert tokens[True] == tokens[False]


@pytest.mark.parametrize(
    ("num_tokens", "num_heads", "num_kv_heads", "head_dim"), [(1, 9, 3, 64), (7, 4, 2, 6)]
)
def test_rotate_and_cache_is_rotate_then_write_bit_for_bit(
    num_tokens, num_heads, num_kv_heads, head_dim
):
    from ladle.attention.base import write_kv_cache
    from ladle.kernels.cpu_native.decode_ops import rotate_and_cache
    from ladle.model.layers.rotary import RotaryEmbedding, rotate_with_tables

    generator = torch.Generator().manual_seed(num_tokens)
    rotary = RotaryEmbedding(head_dim, 512, 10000.0, None)
    positions = torch.randint(0, 512, (num_tokens,), generator=generator)
    tables = rotary.step_tables(positions)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width, generator=generator)
    slots = torch.randperm(4 * 16, generator=generator)[:num_tokens]
    expected_cache = torch.zeros(2, 4, 16, num_kv_heads, head_dim)
    query_key = qkv[:, : (num_heads + num_kv_heads) * head_dim]
    rotated = rotate_with_tables(
        query_key.reshape(num_tokens, num_heads + num_kv_heads, head_dim), tables
    )
    value = qkv[:, (num_heads + num_kv_heads) * head_dim :]
    write_kv_cache(
        rotated[:, num_heads:],
        value.reshape(num_tokens, num_kv_heads, head_dim),
        expected_cache,
        slots,
    )
    cache = torch.zeros_like(expected_cache)
    assert rotate_and_cache(qkv, tables, cache, slots, num_heads, num_kv_heads, head_dim)
    assert torch.equal(qkv[:, : query_key.shape[1]], rotated.reshape(num_tokens, -1))
    assert torch.equal(cache, expected_cache)
    # A slot past the cache: nothing written, the caller's torch path takes it.
    assert not rotate_and_cache(
        qkv, tables, cache, torch.full_like(slots, 64), num_heads, num_kv_heads, head_dim
    )
