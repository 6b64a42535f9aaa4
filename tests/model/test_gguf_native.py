"""GGUF tensors kept in their own format (gguf_native.py): the same values as the float32
dequantization, and the default model kept in Q4_1/Q8_0 against the dequantized one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from ladle.model.layers.group_quant import quantize_int4_groups
from ladle.model.layers.linear import QKVLinear
from ladle.model.layers.quantized_linear import adopt_native_weights_
from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.gguf_dequant import dequantize
from ladle.model.loader.gguf_native import NATIVE_TYPES, native_group_rows

Q = GGMLQuantizationType


def _random_blocks(qtype: Q, num_blocks: int, seed: int) -> np.ndarray:
    """Random block bytes whose float16 fields are finite and small."""
    _, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(num_blocks, type_size), dtype=np.uint8)
    halves = rng.uniform(-2, 2, size=(num_blocks, 2)).astype(np.float16).view(np.uint8)
    if qtype == Q.Q6_K:
        blocks[:, 208:210] = halves[:, :2]
    else:
        blocks[:, 0:4] = halves.reshape(num_blocks, -1)[:, :4]  # d (and m / dmin)
    return blocks.reshape(-1)


@pytest.mark.parametrize("qtype", sorted(NATIVE_TYPES, key=int), ids=lambda q: q.name)
@pytest.mark.parametrize("num_rows", [1, 3])
def test_kept_tensor_equals_its_dequantization(qtype: Q, num_rows: int) -> None:
    block_size, _ = GGML_QUANT_SIZES[qtype]
    shape = (num_rows, 2 * block_size)
    raw = _random_blocks(qtype, num_rows * 2, seed=int(qtype) + num_rows)
    rows = native_group_rows(raw, int(qtype), shape)
    expected = dequantize(raw, int(qtype), shape)
    torch.testing.assert_close(rows.dequantize(), expected, rtol=0, atol=1e-6)
    x = torch.randn(4, shape[1])
    torch.testing.assert_close(
        torch.nn.functional.linear(x, rows.dequantize()), x @ expected.T, rtol=1e-5, atol=1e-5
    )


def test_wrong_byte_count_and_unkept_type_are_clear_errors() -> None:
    raw = _random_blocks(Q.Q4_1, 2, seed=0)
    with pytest.raises(ValueError, match="do not hold a Q4_1 tensor of shape"):
        native_group_rows(raw[:-1], int(Q.Q4_1), (1, 64))
    with pytest.raises(ValueError, match="Q5_0 tensors of shape"):
        native_group_rows(raw, int(Q.Q5_0), (1, 64))


def test_merged_layer_with_mixed_layouts_is_dequantized_into_its_weight() -> None:
    layer = QKVLinear(64, 16, 2, 1, bias=False)
    layer.weight.data.zero_()
    generator = torch.Generator().manual_seed(0)
    shards = {
        "q": quantize_int4_groups(torch.randn(32, 64, generator=generator), 32),
        "k": quantize_int4_groups(torch.randn(16, 64, generator=generator), 64),
        "v": quantize_int4_groups(torch.randn(16, 64, generator=generator), 32),
    }
    for shard, rows in shards.items():
        layer.weight_loader(layer.weight, rows, shard)
    kept, dequantized = adopt_native_weights_(torch.nn.ModuleDict({"qkv": layer}))
    assert (kept, dequantized) == ([], ["qkv"])
    expected = torch.cat([rows.dequantize() for rows in shards.values()])
    torch.testing.assert_close(layer.weight.data, expected)
    with pytest.raises(ModelLoadError, match="does not fit"):
        layer.weight_loader(layer.weight, shards["q"], "k")


def test_default_model_kept_in_gguf_format_holds_the_dequantized_weights() -> None:
    from ladle.attention.cpu_backend import CpuAttentionBackend
    from ladle.config import ModelConfig
    from ladle.model.default_model import resolve_default_model
    from ladle.model.layers.group_quant import GroupQuantizedRows
    from ladle.model.loader import load_model
    from ladle.model.loader.gguf import iter_gguf_weights
    from ladle.worker.memory import module_bytes

    path = str(resolve_default_model(show_progress=False))
    config = ModelConfig(model=path, quantization="gguf")
    model = load_model(config, torch.device("cpu"), torch.float32, CpuAttentionBackend()).model
    kept = [
        module
        for module in model.modules()
        if isinstance(getattr(module, "quantized_weight", None), GroupQuantizedRows)
    ]
    assert len(kept) == 4 * model.config.num_hidden_layers + 1  # every linear, and the table
    # Q4_1 (20 bytes per 32 values) and the Q8_0 table (34 per 32): under a quarter of float32.
    num_parameters = sum(module.quantized_weight.dequantize().numel() for module in kept)
    assert module_bytes(model) < 0.25 * 4 * num_parameters
    # The float32 dequantization of the first block's tensors, permuted as the loader does.
    layer = model.model.layers[0]
    rows_of = {
        "model.embed_tokens.weight": (model.model.embed_tokens, 0),
        "model.layers.0.self_attn.q_proj.weight": (layer.self_attn.qkv_proj, 0),
        "model.layers.0.self_attn.k_proj.weight": (layer.self_attn.qkv_proj, 576),
        "model.layers.0.mlp.up_proj.weight": (layer.mlp.gate_up_proj, 1536),
        "model.layers.0.mlp.down_proj.weight": (layer.mlp.down_proj, 0),
    }
    for name, weight in iter_gguf_weights(path):
        if name in rows_of:
            module, start = rows_of.pop(name)
            kept_rows = module.quantized_weight.dequantize()[start : start + weight.shape[0]]
            torch.testing.assert_close(kept_rows, weight, rtol=0, atol=1e-6, msg=name)
        if not rows_of:
            break
    assert not rows_of
