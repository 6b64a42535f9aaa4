"""Act-order int4 checkpoints (GPTQ desc_act, compressed-tensors actorder "group";
quant/act_order.py) and group sizes other than 128 on the CPU, from folders made as GPTQ,
AutoAWQ and llm-compressor make them (helpers/int4_folders.py): ladle must compute what their
dequantized weights compute, and name what it cannot load."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.int4_folders import write_act_order_folder
from helpers.tiny_models import paged_logits, save_tiny_model
from safetensors.torch import load_file, save_file

from ladle.attention.torch_backend import TorchAttentionBackend
from ladle.config import ModelConfig
from ladle.model.loader import load_model
from ladle.model.loader.errors import ModelLoadError

CPU = torch.device("cpu")
MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _load(path):
    return load_model(ModelConfig(model=str(path)), CPU, torch.float32, TorchAttentionBackend())


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> str:
    # hidden 320: q/k/v and gate/up read three groups (the last partial); intermediate 200:
    # down's two; o's 64 inputs are one group, where no order can matter.
    return save_tiny_model(
        tmp_path_factory.mktemp("act_order"), "qwen2", hidden_size=320, intermediate_size=200
    )


def _float_model_with(float_dir: str, weights: dict[str, torch.Tensor]):
    reference = _load(float_dir)
    for module_name, module in reference.model.named_modules():
        base, _, leaf = module_name.rpartition(".")
        names = [f"{base}.{part}" for part in MERGED.get(leaf, (leaf,))]
        if all(name in weights for name in names):
            module.weight.data.copy_(torch.cat([weights[name] for name in names]))
    return reference


@pytest.fixture(scope="module")
def whole_group_model(tmp_path_factory) -> str:
    # compressed-tensors int4 needs whole groups: every projection's inputs 256 or 384.
    return save_tiny_model(
        tmp_path_factory.mktemp("act_order_ct"),
        "qwen2",
        hidden_size=256,
        intermediate_size=384,
        head_dim=64,
    )


@pytest.mark.parametrize("fmt", ["gptq", "compressed-tensors"])
def test_act_order_checkpoint_computes_its_dequantized_weights(
    float_model, whole_group_model, tmp_path, fmt
):
    source = float_model if fmt == "gptq" else whole_group_model
    weights = write_act_order_folder(source, tmp_path / "act_order", fmt=fmt)
    loaded = _load(tmp_path / "act_order")
    assert loaded.checkpoint_quantization == "int4"
    permuted = [
        m for m in loaded.model.modules() if getattr(m, "input_permutation", None) is not None
    ]
    # qkv and gate_up of both layers, o too where its inputs make several groups; down's order
    # is folded into gate_up's rows (no gather of its own).
    assert len(permuted) == (2 if fmt == "gptq" else 3) * 2
    assert all(layer.mlp.down_proj.input_permutation is None for layer in loaded.model.model.layers)
    expected = paged_logits(_float_model_with(source, weights))
    got = paged_logits(loaded)
    # The same float32 weights on inputs gathered into group order: summation order only.
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_ignoring_the_order_would_be_far_off(float_model, tmp_path):
    """The check above can fail: read as if g_idx were k // 128 (the words' order) the same
    folder computes other numbers."""
    weights = write_act_order_folder(float_model, tmp_path / "gptq")
    expected = paged_logits(_float_model_with(float_model, weights))
    loaded = _load(tmp_path / "gptq")
    for module in loaded.model.modules():
        if getattr(module, "input_permutation", None) is not None:
            module.input_permutation = None
    error = (paged_logits(loaded) - expected).norm() / expected.norm()
    assert error > 0.05


def test_in_order_g_idx_under_desc_act_runs_without_a_gather(float_model, tmp_path):
    def in_order(name, order):
        return torch.arange(order.numel())

    write_act_order_folder(float_model, tmp_path / "gptq", shuffle=in_order)
    loaded = _load(tmp_path / "gptq")
    assert all(getattr(m, "input_permutation", None) is None for m in loaded.model.modules())


def test_merged_projections_with_different_orders_are_refused(float_model, tmp_path):
    def shuffle(name, order):
        return order.flip(0) if ".k_proj." in name else order

    write_act_order_folder(float_model, tmp_path / "gptq", shuffle=shuffle)
    with pytest.raises(ModelLoadError, match=r"_proj.input_permutation.*differs"):
        _load(tmp_path / "gptq")


def test_groups_that_are_not_128_inputs_are_named(float_model, tmp_path):
    write_act_order_folder(float_model, tmp_path / "gptq")
    file = tmp_path / "gptq" / "model.safetensors"
    tensors = load_file(file)
    name = "model.layers.0.mlp.down_proj.g_idx"
    tensors[name] = tensors[name].clone()
    first_of_group_1 = int((tensors[name] == 1).nonzero()[0])
    tensors[name][first_of_group_1] = 0  # group 0 now holds 129 inputs
    save_file(tensors, str(file))
    with pytest.raises(ModelLoadError, match="down_proj.g_idx.*128 inputs in each group"):
        _load(tmp_path / "gptq")


@pytest.mark.parametrize(
    "fmt,group_size,act_order",
    [
        ("gptq", 32, False),
        ("gptq", 64, True),
        ("gptq", -1, False),
        ("gptq", -1, True),
        ("awq", 64, False),
        ("compressed-tensors", 64, False),
        ("compressed-tensors", -1, False),
        ("compressed-tensors", 32, True),
    ],
)
def test_group_sizes_other_than_128_compute_their_dequantized_weights(
    float_model, whole_group_model, tmp_path, fmt, group_size, act_order
):
    """GPTQ, AWQ and compressed-tensors checkpoints in groups of 32 or 64, or one group per
    channel (group_size -1, run as groups of 128 repeating the channel's scale and zero)."""
    from helpers.int4_folders import write_int4_folder

    source = whole_group_model if fmt == "compressed-tensors" else float_model
    weights = write_int4_folder(source, tmp_path / "int4", fmt, group_size, act_order)
    loaded = _load(tmp_path / "int4")
    expected_group = 128 if group_size == -1 else group_size
    methods = [m.quant_method for m in loaded.model.modules() if getattr(m, "quant_method", None)]
    assert methods and all(method.group_size == expected_group for method in methods)
    expected = paged_logits(_float_model_with(source, weights))
    error = ((paged_logits(loaded) - expected).norm() / expected.norm()).item()
    # Groups of 32 and 64 take the CPU's integer kernels, which quantize activations to 16 bits
    # (as for a GGUF's 4-bit rows; docs/quantization.md): 1e-4-ish, against ~1 for a misread.
    assert error < 2e-3


def test_a_group_size_ladle_cannot_run_is_named(float_model, tmp_path):
    from helpers.int4_folders import write_int4_folder

    write_int4_folder(float_model, tmp_path / "int4", "gptq", 32)
    config_path = tmp_path / "int4" / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"]["group_size"] = 48
    config_path.write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="group_size=48"):
        _load(tmp_path / "int4")
