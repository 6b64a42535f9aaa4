"""fp8 mixtures of experts on the CPU (layers/moe_fp8.py): checkpoints in the Hub's layout
(`quant_method: fp8`, experts' e4m3 `weight` with `weight_scale_inv` per block, or per-channel
`weight_scale`) load, are dequantized once, and give transformers' float32 logits of the same
dequantized weights; against the float model they stay within fp8's rounding. The torch path
of fp8 stacks (the GPU's reference) and `--quantization fp8`'s per-channel experts are checked
against the float experts too."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers.tiny_models import folder_logits, load_float32_on_cpu, paged_logits
from safetensors.torch import load_file, save_file

from ladle.model.layers.moe import SparseMoeBlock, grouped_experts_forward
from ladle.model.layers.moe_fp8 import quantize_experts_fp8_
from ladle.model.layers.quant.fp8 import FP8_DTYPE, quantize_fp8_per_row
from ladle.model.layers.quant.fp8_block import expand_groups, quantize_fp8_blocks
from ladle.model.loader.errors import ModelLoadError

CPU = torch.device("cpu")
EXPERT_WEIGHT = re.compile(r"\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def _write_fp8_experts(source: str, folder: Path, block: int | None) -> Path:
    """A copy of a tiny float MoE folder whose expert matrices are e4m3 (block x block scales
    as weight_scale_inv, or per-channel weight_scale), attention left float as listed in
    modules_to_not_convert; and beside it (`folder`_dequantized) the same model with those
    experts dequantized back to float32: the exact reference."""
    shutil.copytree(source, folder)
    reference = Path(str(folder) + "_dequantized")
    shutil.copytree(source, reference)
    weights = load_file(folder / "model.safetensors")
    quantized, dequantized = {}, {}
    for name, tensor in weights.items():
        if not EXPERT_WEIGHT.search(name):
            quantized[name] = dequantized[name] = tensor
            continue
        prefix = name.removesuffix(".weight")
        if block is None:
            codes, scale = quantize_fp8_per_row(tensor)
            quantized[prefix + ".weight_scale"] = scale
            full = scale[:, None]
        else:
            codes, row_scales = quantize_fp8_blocks(tensor, block, block)
            quantized[prefix + ".weight_scale_inv"] = row_scales[::block].contiguous()
            full = expand_groups(row_scales, tensor.shape[1], block)
        quantized[name] = codes
        dequantized[name] = codes.float() * full
    save_file(quantized, folder / "model.safetensors", metadata={"format": "pt"})
    save_file(dequantized, reference / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    layers = config["num_hidden_layers"]
    quantization = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3"}
    # As Qwen3-30B-A3B-FP8 lists its routers (and lm_head) as left in float.
    mixtral = config["architectures"] == ["MixtralForCausalLM"]
    moe_block = "block_sparse_moe" if mixtral else "mlp"
    quantization["modules_to_not_convert"] = [
        f"model.layers.{i}.self_attn.{p}" for i in range(layers) for p in ATTENTION
    ] + [f"model.layers.{i}.{moe_block}.gate" for i in range(layers)] + ["lm_head"]
    if block is not None:
        quantization["weight_block_size"] = [block, block]
    config["quantization_config"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    return reference


@pytest.mark.parametrize("architecture", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("block", [128, 32, None], ids=["blocks128", "blocks32", "channel"])
def test_fp8_experts_load_and_match_their_dequantized_weights(
    architecture, block, tiny_model_path, tmp_path
):
    source = tiny_model_path(architecture)
    folder = tmp_path / "fp8"
    reference = _write_fp8_experts(source, folder, block)
    loaded = load_float32_on_cpu(folder)
    assert loaded.checkpoint_quantization == "fp8"
    blocks = [m for m in loaded.model.modules() if isinstance(m, SparseMoeBlock)]
    assert blocks and all(b.experts.gate_up_proj.dtype == torch.float32 for b in blocks)
    got = paged_logits(loaded)
    exact = folder_logits(reference, CPU, torch.float32)
    torch.testing.assert_close(got, exact, rtol=1e-5, atol=1e-5)
    # Against the float model: within fp8's rounding (3 mantissa bits, relative error up to
    # 1/16 a weight; about 2% of the logits' norm here), and far from a wrong layout.
    float_logits = folder_logits(source, CPU, torch.float32)
    relative = (got - float_logits).norm() / float_logits.norm()
    assert relative < 0.06, relative


def test_a_misshapen_expert_scale_is_named(tiny_model_path, tmp_path):
    folder = tmp_path / "fp8"
    _write_fp8_experts(tiny_model_path("qwen3_moe"), folder, 32)
    weights = load_file(folder / "model.safetensors")
    name = "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv"
    weights[name] = torch.ones(3, 3)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelLoadError, match=re.escape(name) + r".*\(3, 3\).*\(2, 1\)"):
        load_float32_on_cpu(folder)


def _block(seed: int) -> SparseMoeBlock:
    torch.manual_seed(seed)
    block = SparseMoeBlock(hidden_size=256, num_experts=8, top_k=2, intermediate_size=128,
                           norm_topk_prob=True)  # fmt: skip
    for param in block.parameters():
        param.data.normal_(0, 0.05)
    return block


def test_fp8_stacks_on_the_torch_path_dequantize_with_group_scales():
    """Codes and [E, N, G] scales left in the stack (as on a GPU without the fused path) run the
    torch path on codes times scales."""
    block = _block(0)
    experts = block.experts
    float_gate_up, float_down = experts.gate_up_proj.data.clone(), experts.down_proj.data.clone()
    for name, scale_name in (("gate_up_proj", "gate_up_scale"), ("down_proj", "down_scale")):
        stack = getattr(experts, name).data
        pairs = [quantize_fp8_blocks(matrix, 128, 128) for matrix in stack]
        setattr(experts, name, torch.nn.Parameter(torch.stack([c for c, _ in pairs]), False))
        setattr(experts, scale_name, torch.nn.Parameter(torch.stack([s for _, s in pairs]), False))
    experts.scale_group = 128
    assert experts.is_fp8 and experts.gate_up_scale.shape == (8, 256, 2)
    hidden = torch.randn(7, 256)
    routing = block.gate(hidden)
    got = experts(hidden, routing)
    gate_up, down = experts.float_stacks(torch.float32)
    expected = grouped_experts_forward(hidden, routing.weights, routing.expert_ids, gate_up, down)
    torch.testing.assert_close(got, expected)
    exact = grouped_experts_forward(
        hidden, routing.weights, routing.expert_ids, float_gate_up, float_down
    )
    assert ((got - exact).norm() / exact.norm()) < 0.06


def test_quantize_experts_fp8_is_per_channel_and_close_to_float():
    block = _block(1)
    hidden = torch.randn(9, 256)
    expected = block(hidden)
    float_down = block.experts.down_proj.data.clone()
    assert quantize_experts_fp8_(block) == 2
    experts = block.experts
    assert experts.down_proj.dtype == FP8_DTYPE and experts.down_scale.shape == (8, 256)
    codes, scale = quantize_fp8_per_row(float_down[5])
    assert torch.equal(experts.down_proj[5].view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(experts.down_scale[5], scale)
    got = block(hidden)
    assert ((got - expected).norm() / expected.norm()) < 0.06
