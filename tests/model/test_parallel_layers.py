"""Tensor-parallel layers load exactly their rank's slice: the ranks' pieces put back together
are the whole weight, whatever the split (rows, columns, merged shards, replicated key/value
heads, a padded vocabulary). No processes: the ranks are built side by side."""

from __future__ import annotations

import pytest
import torch

from ladle.distributed.tensor_parallel import TensorParallel
from ladle.model.layers.embedding import LMHead, VocabEmbedding
from ladle.model.layers.parallel_linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from ladle.model.load_errors import ModelLoadError


def ranks(size: int) -> list[TensorParallel]:
    return [TensorParallel(rank=rank, size=size) for rank in range(size)]


def materialise(layer: torch.nn.Module) -> torch.nn.Module:
    for param in layer.parameters():
        param.data = torch.empty_like(param.data)
    return layer


@pytest.mark.parametrize("size", [2, 4])
def test_column_and_row_slices_reassemble_the_weight(size):
    weight = torch.randn(8, 12)
    bias = torch.randn(8)
    columns = [materialise(ColumnParallelLinear(12, 8, tp, bias=True)) for tp in ranks(size)]
    for layer in columns:
        layer.weight_loader(layer.weight, weight)
        layer.weight_loader(layer.bias, bias)
    assert torch.equal(torch.cat([layer.weight for layer in columns]), weight)
    assert torch.equal(torch.cat([layer.bias for layer in columns]), bias)

    rows = [materialise(RowParallelLinear(8, 12, tp, bias=True)) for tp in ranks(size)]
    row_bias = torch.randn(12)
    for layer in rows:
        layer.weight_loader(layer.weight, weight.T.contiguous())
        layer.weight_loader(layer.bias, row_bias)
    assert torch.equal(torch.cat([layer.weight for layer in rows], dim=1), weight.T)
    # The partial products of the ranks sum to the whole product, the bias counted once.
    x = torch.randn(3, 8)
    pieces = x.split(8 // size, dim=-1)
    partial_sum = sum(
        torch.nn.functional.linear(piece, layer.weight, layer.bias)
        for piece, layer in zip(pieces, rows)
    )
    torch.testing.assert_close(partial_sum, x @ weight + row_bias)


def test_merged_gate_up_keeps_each_ranks_gate_beside_its_up():
    gate, up = torch.randn(6, 4), torch.randn(6, 4)
    layers = [materialise(MergedColumnParallelLinear(4, [6, 6], tp)) for tp in ranks(2)]
    for rank, layer in enumerate(layers):
        layer.weight_loader(layer.weight, gate, 0)
        layer.weight_loader(layer.weight, up, 1)
        rows = slice(3 * rank, 3 * rank + 3)
        assert torch.equal(layer.weight, torch.cat([gate[rows], up[rows]]))


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_qkv_splits_query_heads_and_splits_or_replicates_kv_heads(num_kv_heads):
    head_dim, hidden, num_heads, size = 2, 8, 4, 4
    q = torch.randn(num_heads * head_dim, hidden)
    k = torch.randn(num_kv_heads * head_dim, hidden)
    v = torch.randn(num_kv_heads * head_dim, hidden)
    for tp in ranks(size):
        layer = materialise(QKVParallelLinear(hidden, head_dim, num_heads, num_kv_heads, tp))
        for shard, tensor in (("q", q), ("k", k), ("v", v)):
            layer.weight_loader(layer.weight, tensor, shard)
        query, key, value = layer.weight.split([layer.q_size, layer.kv_size, layer.kv_size])
        assert torch.equal(query, q[tp.rank * head_dim : (tp.rank + 1) * head_dim])
        # Query head `rank` attends to key/value head rank // (num_heads // num_kv_heads).
        kv_head = tp.rank // (num_heads // num_kv_heads)
        kv_rows = slice(kv_head * head_dim, (kv_head + 1) * head_dim)
        assert torch.equal(key, k[kv_rows]) and torch.equal(value, v[kv_rows])


def test_a_padded_vocabulary_splits_and_gathers_back():
    table = torch.randn(11, 4)  # 11 rows over 2 ranks: 6 each, the last padded with zeros
    shards = [materialise(VocabEmbedding(11, 4, tp)) for tp in ranks(2)]
    for shard in shards:
        shard.weight_loader(shard.weight, table)
    assert [shard.vocab_start for shard in shards] == [0, 6]
    assert torch.equal(torch.cat([s.weight for s in shards])[:11], table)
    assert torch.equal(shards[1].weight[5], torch.zeros(4))
    # Each id is looked up by exactly one rank: the masked lookups sum to the table's rows.
    ids = torch.tensor([0, 5, 6, 10])
    looked_up = 0
    for shard in shards:
        local = ids - shard.vocab_start
        mine = (local >= 0) & (local < shard.vocab_size)
        looked_up = looked_up + shard._lookup(local * mine) * mine.unsqueeze(-1)
    assert torch.equal(looked_up, table[ids])
    head = materialise(LMHead(11, 4, ranks(2)[1]))
    head.weight_loader(head.weight, table)
    assert torch.equal(head.weight[:5], table[6:])


def test_a_misshapen_tensor_is_refused_before_it_is_sliced():
    layer = materialise(ColumnParallelLinear(4, 8, ranks(2)[0]))
    with pytest.raises(ModelLoadError, match="dimension 0 should be 8"):
        layer.weight_loader(layer.weight, torch.randn(16, 4))  # rank 0's half would "fit"
    row = materialise(RowParallelLinear(8, 4, ranks(2)[1]))
    with pytest.raises(ModelLoadError, match="dimension 1 should be 8"):
        row.weight_loader(row.weight, torch.randn(4, 6))


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda tp: QKVParallelLinear(8, 2, 6, 2, tp), "does not divide the number of attention"),
        (lambda tp: QKVParallelLinear(8, 2, 8, 3, tp), "neither a divisor nor a multiple"),
        (lambda tp: MergedColumnParallelLinear(8, [6, 6], tp), "merged projection"),
    ],
)
def test_sizes_the_ranks_cannot_split_are_named(build, message):
    with pytest.raises(ValueError, match=message):
        build(TensorParallel(rank=0, size=4))


@pytest.mark.parametrize("size", [2, 4, 8])
def test_the_70b_shape_splits_into_even_shares(size):
    """Llama-3.1-70B on `size` ranks (built on the meta device: no memory): every rank holds
    1/size of the layers' weights and of the vocabulary, all of the norms."""
    from ladle.attention.torch_backend import TorchAttentionBackend
    from ladle.model.arch_config import ModelArchConfig
    from ladle.model.loader.presets import get_preset
    from ladle.model.models.llama import LlamaForCausalLM

    arch = ModelArchConfig.from_hf_dict(get_preset("llama-3.1-70b"))
    with torch.device("meta"):
        whole = LlamaForCausalLM(arch, TorchAttentionBackend())
        shares = [
            LlamaForCausalLM(arch, TorchAttentionBackend(), tp) for tp in ranks(size)[:2]
        ]
    total = sum(p.numel() for p in whole.parameters())
    norms = sum(p.numel() for n, p in whole.named_parameters() if "norm" in n)
    assert 70.0e9 < total < 71.0e9
    for share in shares:
        held = sum(p.numel() for p in share.parameters())
        assert held == (total - norms) // size + norms
