"""Layer-level checks against Hugging Face's own implementations."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import LLAMA3_TINY_SCALING

from ladle.kernels.cpu_native.build import set_native_kernels
from ladle.model.layers.activation import SiluAndMul
from ladle.model.layers.linear import MergedLinear, QKVLinear
from ladle.model.layers.norm import RMSNorm
from ladle.model.layers.rotary import RotaryEmbedding, compute_inv_freq, rotate_with_tables
from ladle.model.loader.errors import ModelLoadError


@pytest.mark.parametrize(
    ("head_dim", "theta", "scaling"),
    [
        (16, 10000.0, None),
        (16, 10000.0, LLAMA3_TINY_SCALING),
        (128, 500000.0, {**LLAMA3_TINY_SCALING, "original_max_position_embeddings": 8192}),
        (
            64,
            500000.0,
            {**LLAMA3_TINY_SCALING, "factor": 32.0, "original_max_position_embeddings": 8192},
        ),
    ],
)
def test_inv_freq_matches_transformers(head_dim, theta, scaling):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling=dict(scaling) if scaling else None,
    )
    if scaling is None:
        expected = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    torch.testing.assert_close(compute_inv_freq(head_dim, theta, scaling), expected, rtol=0, atol=0)


def test_rotary_matches_hf_apply_rotary_pos_emb():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    head_dim, max_positions = 16, 64
    rotary = RotaryEmbedding(head_dim, max_positions, 10000.0, LLAMA3_TINY_SCALING)
    positions = torch.tensor([0, 1, 2, 7, 3, 63, 5])
    query = torch.randn(len(positions), 4, head_dim)
    key = torch.randn(len(positions), 2, head_dim)
    inv_freq = compute_inv_freq(head_dim, 10000.0, LLAMA3_TINY_SCALING)
    freqs = positions[:, None].float() * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    # HF layout: [batch, heads, tokens, dim] with cos/sin [batch, tokens, dim].
    expected_q, expected_k = apply_rotary_pos_emb(
        query.transpose(0, 1)[None], key.transpose(0, 1)[None], emb.cos()[None], emb.sin()[None]
    )
    actual_q, actual_k = rotary(positions, query, key)
    torch.testing.assert_close(actual_q, expected_q[0].transpose(0, 1))
    torch.testing.assert_close(actual_k, expected_k[0].transpose(0, 1))


def test_step_tables_rotate_query_and_key_together_bit_for_bit():
    """The CPU path's shared per-step tables rotate stacked q and k heads to exactly what the
    per-tensor rotary (checked against HF above) gives each of them."""
    head_dim = 16
    rotary = RotaryEmbedding(head_dim, 64, 10000.0, LLAMA3_TINY_SCALING)
    positions = torch.tensor([0, 1, 2, 7, 3, 63, 5])
    generator = torch.Generator().manual_seed(4)
    stacked = torch.randn(len(positions), 4 + 2, head_dim, generator=generator)
    expected_q, expected_k = rotary(positions, stacked[:, :4], stacked[:, 4:])
    rotated = rotate_with_tables(stacked, rotary.step_tables(positions))
    assert torch.equal(rotated[:, :4], expected_q)
    assert torch.equal(rotated[:, 4:], expected_k)


@pytest.fixture
def torch_cpu_ops():
    """The torch path of the CPU layers: ladle's C kernels off for the test."""
    previous = set_native_kernels(False)
    yield
    set_native_kernels(previous)


def test_float32_rms_norm_is_the_reference_formula_bit_for_bit(torch_cpu_ops):
    """float32 norms run as one F.rms_norm (without the C kernels, whose sums run in another
    order: tests/kernels/test_cpu_native_ops.py): the same values as the formula (HF's), at
    the shapes the model uses, strided q/k-norm views included."""
    generator = torch.Generator().manual_seed(5)
    for shape in [(1, 576), (7, 576), (32, 64), (3, 9, 64)]:
        norm = RMSNorm(shape[-1], eps=1e-5)
        torch.nn.init.normal_(norm.weight, generator=generator)
        x = torch.randn(*shape, generator=generator) * 30
        variance = x.pow(2).mean(-1, keepdim=True)
        assert torch.equal(norm(x), norm.weight * (x * torch.rsqrt(variance + 1e-5)))
    strided = torch.randn(4, 12, 64, generator=generator)[:, :9]
    norm = RMSNorm(64, eps=1e-6)
    torch.nn.init.normal_(norm.weight, generator=generator)
    variance = strided.pow(2).mean(-1, keepdim=True)
    assert torch.equal(norm(strided), norm.weight * (strided * torch.rsqrt(variance + 1e-6)))


def test_rms_norm_fused_residual_add():
    """The sum may be written into the residual passed in (CUDA and the CPU's C kernel do):
    callers hand the returned residual on and never read the old one."""
    norm = RMSNorm(8, eps=1e-5)
    torch.nn.init.normal_(norm.weight)
    x, residual = torch.randn(3, 8), torch.randn(3, 8)
    total = x + residual
    normed, new_residual = norm(x, residual)
    torch.testing.assert_close(new_residual, total)
    variance = total.pow(2).mean(-1, keepdim=True)
    torch.testing.assert_close(normed, norm.weight * total / torch.sqrt(variance + 1e-5))


def test_silu_and_mul():
    x = torch.randn(5, 12)
    torch.testing.assert_close(SiluAndMul()(x), torch.nn.functional.silu(x[:, :6]) * x[:, 6:])


def test_merged_linears_load_shards_into_their_rows():
    qkv = QKVLinear(hidden_size=8, head_dim=2, num_heads=4, num_kv_heads=2, bias=True)
    q, k, v = torch.randn(8, 8), torch.randn(4, 8), torch.randn(4, 8)
    for shard_id, weight in (("v", v), ("q", q), ("k", k)):
        qkv.weight_loader(qkv.weight, weight, shard_id)
    torch.testing.assert_close(qkv.weight.data, torch.cat([q, k, v]))
    with pytest.raises(ModelLoadError, match=r"\(3, 8\)"):
        qkv.weight_loader(qkv.weight, torch.randn(3, 8), "k")
    gate_up = MergedLinear(4, [6, 6])
    gate_up.weight_loader(gate_up.weight, torch.ones(6, 4), 1)
    assert gate_up.weight.data[6:].eq(1).all()
