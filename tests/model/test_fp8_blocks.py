"""Block-scaled fp8 (quant/fp8_block.py) on the CPU: the activation and weight quantizers against
plain float64 references at awkward sizes, checkpoints with `weight_block_size` loaded with
their block scales exactly (not re-quantized per channel), `ladle quantize --weight-block-size`
round trips, the folder transformers reads, and malformed block checkpoints named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.tiny_models import paged_logits, save_tiny_model
from safetensors.torch import load_file, save_file

from ladle.attention.torch_backend import TorchAttentionBackend
from ladle.config import ModelConfig
from ladle.kernels.per_token_rule import per_group_quant_reference
from ladle.model.layers.quant import quantize_linears_
from ladle.model.layers.quant.fp8 import FP8_DTYPE
from ladle.model.layers.quant.fp8_block import Fp8BlockMethod
from ladle.model.loader import load_model
from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.quantized_formats import LINEAR_WEIGHT
from ladle.model.loader.quantized_writer import write_quantized_checkpoint

CPU = torch.device("cpu")
MERGED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _load(path: str | Path):
    return load_model(ModelConfig(model=str(path)), CPU, torch.float32, TorchAttentionBackend())


def _e4m3_round_trip_bound(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The most an e4m3 rounding of values / scale moves a value: half a step of its binade
    (3 mantissa bits), or half the subnormal step 2^-9 near zero, in the values' units."""
    magnitude = (values / scale).abs().clamp(min=2.0**-6)
    half_step = torch.exp2(torch.floor(torch.log2(magnitude)) - 4)
    return half_step * scale


@pytest.mark.parametrize("num_rows", [1, 7])
@pytest.mark.parametrize("num_columns", [1, 31, 64, 129, 576])
@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_group_activation_codes_are_each_groups_own_per_token_codes(
    num_rows, num_columns, group_size
):
    generator = torch.Generator().manual_seed(num_rows * 1000 + num_columns)
    x = torch.randn(num_rows, num_columns, generator=generator, dtype=torch.float64)
    x[:, ::17] *= 40  # outliers: each group's scale must be its own, not the row's
    codes, scale = per_group_quant_reference(x.float(), FP8_DTYPE, group_size)
    num_groups = -(-num_columns // group_size)
    assert codes.shape == (num_rows, num_columns) and codes.dtype == FP8_DTYPE
    assert scale.shape == (num_rows, num_groups) and scale.dtype == torch.float32
    for group in range(num_groups):
        columns = slice(group * group_size, (group + 1) * group_size)
        piece = x[:, columns]
        expected_scale = piece.abs().amax(dim=1) / 448.0
        torch.testing.assert_close(scale[:, group].double(), expected_scale, rtol=2e-7, atol=0)
        dequantized = codes[:, columns].double() * scale[:, group, None].double()
        bound = _e4m3_round_trip_bound(piece, scale[:, group, None].double())
        assert bool(((dequantized - piece).abs() <= bound * 1.0001).all())
        # Each group's max lands on 448 exactly.
        assert bool((codes[:, columns].float().abs().amax(dim=1) == 448).all())


def _reference_blocks(weight: torch.Tensor, rows: int, columns: int) -> torch.Tensor:
    """Block quantization in float64, block by block: the e4m3 codes as float64."""
    weight = weight.double()
    out = torch.empty_like(weight)
    for r in range(0, weight.shape[0], rows):
        for c in range(0, weight.shape[1], columns):
            block = weight[r : r + rows, c : c + columns]
            scale = block.abs().max() / 448.0
            out[r : r + rows, c : c + columns] = (block / scale).float().to(FP8_DTYPE).double()
    return out


@pytest.mark.parametrize("shape", [(1, 1), (7, 129), (200, 64), (130, 576)])
@pytest.mark.parametrize("block", [(128, 128), (64, 64), (1, 32), (16, 256)])
def test_block_quantization_matches_a_block_by_block_reference(shape, block):
    generator = torch.Generator().manual_seed(shape[0] + shape[1])
    weight = torch.randn(shape, generator=generator) * 0.05
    weight[0, 0] = 3.0  # one large weight: only its own block's scale may grow
    method = Fp8BlockMethod(*block)
    tensors = method.quantize(weight)
    num_groups = -(-shape[1] // block[1])
    assert tensors["weight_scale"].shape == (shape[0], num_groups)
    dequantized = method.dequantize(tensors, shape[1]).double()
    # The scale is max * (1/448) in float32 here, max / 448 in float64 there: a code may differ
    # by one step where a value sits on a rounding boundary, rarely, never by more.
    expected_codes = _reference_blocks(weight, *block)
    codes = tensors["weight"].double()
    assert (codes != expected_codes).double().mean() < 0.01
    assert bool(((codes - expected_codes).abs() <= 2 * _e4m3_round_trip_bound(codes, 1.0)).all())
    scale = tensors["weight_scale"].double().repeat_interleave(block[1], 1)[:, : shape[1]]
    bound = _e4m3_round_trip_bound(weight.double(), scale)
    assert bool(((dequantized - weight.double()).abs() <= bound * 1.0001).all())
    # Rows of one block share its scale; the large weight is exact.
    for start in range(0, shape[0], block[0]):
        rows = tensors["weight_scale"][start : start + block[0]]
        assert bool((rows == rows[0]).all())
    assert dequantized[0, 0].item() == pytest.approx(3.0, rel=1e-6)


def test_block_sizes_ladle_cannot_run_are_refused():
    with pytest.raises(ValueError, match="100"):
        Fp8BlockMethod(128, 100)
    with pytest.raises(ValueError, match="0 x 128"):
        Fp8BlockMethod(0, 128)


def _block_folder(float_dir: str, out: Path, block: tuple[int, int]) -> dict[str, torch.Tensor]:
    """A DeepSeek-layout fp8 folder (`weight` e4m3, `weight_scale_inv` per block) written here,
    not by ladle; returns each projection's exactly dequantized weight."""
    tensors, dequantized = {}, {}
    for name, tensor in load_file(str(Path(float_dir) / "model.safetensors")).items():
        if not LINEAR_WEIGHT.search(name):
            tensors[name] = tensor
            continue
        rows, cols = tensor.shape
        padded = torch.nn.functional.pad(tensor, (0, -cols % block[1], 0, -rows % block[0]))
        blocks = padded.view(padded.shape[0] // block[0], block[0], -1, block[1])
        scale_inv = blocks.abs().amax(dim=(1, 3)) / 448.0
        full = scale_inv.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
        full = full[:rows, :cols]
        codes = (tensor / full).to(FP8_DTYPE)
        tensors[name] = codes
        tensors[name.removesuffix("weight") + "weight_scale_inv"] = scale_inv
        dequantized[name.removesuffix(".weight")] = codes.float() * full
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    config = json.loads((Path(float_dir) / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": list(block),
    }
    (out / "config.json").write_text(json.dumps(config))
    for side_file in Path(float_dir).iterdir():
        if side_file.name.startswith("tokenizer"):
            (out / side_file.name).write_bytes(side_file.read_bytes())
    return dequantized


def _quantized_linears(loaded):
    return [
        (name, module)
        for name, module in loaded.model.named_modules()
        if getattr(module, "quant_method", None) is not None
    ]


def _checkpoint_weight(module_name: str, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    base, _, leaf = module_name.rpartition(".")
    return torch.cat([weights[f"{base}.{name}"] for name in MERGED.get(leaf, (leaf,))])


@pytest.fixture(scope="module")
def odd_model(tmp_path_factory) -> str:
    # intermediate 200: gate/up rows and down's inputs end in partial 128-blocks.
    return save_tiny_model(tmp_path_factory.mktemp("blocks"), "qwen2", intermediate_size=200)


@pytest.fixture(scope="module")
def whole_block_model(tmp_path_factory) -> str:
    # Every projection a whole number of 32 x 32 blocks (hidden 64, q 64 rows, k/v 32 rows).
    return save_tiny_model(tmp_path_factory.mktemp("blocks32"), "llama")


def test_block_checkpoint_loads_its_block_scales_exactly(odd_model, tmp_path):
    weights = _block_folder(odd_model, tmp_path / "fp8", (128, 128))
    loaded = _load(tmp_path / "fp8")
    assert loaded.checkpoint_quantization == "fp8"
    linears = _quantized_linears(loaded)
    assert len(linears) == 4 * 2
    for module_name, module in linears:
        assert isinstance(module.quant_method, Fp8BlockMethod)
        # Exactly the checkpoint's weights: no second rounding to per-channel e4m3.
        assert torch.equal(module.weight_dequantized, _checkpoint_weight(module_name, weights))
    # The activations are quantized per token and group of 128; the logits stay near the float
    # model's with the same (dequantized) weights.
    float_model = _load(odd_model)
    for module_name, module in float_model.model.named_modules():
        if module_name in dict(linears):
            module.weight.data.copy_(_checkpoint_weight(module_name, weights))
    expected, got = paged_logits(float_model), paged_logits(loaded)
    error = ((got - expected).norm() / expected.norm()).item()
    assert 0 < error < 0.1


def test_block_checkpoint_differs_from_per_channel_requantization(odd_model, tmp_path):
    """The old reading (blocks dequantized, re-quantized per channel) moved weights; the new one
    keeps the checkpoint's values, so the two disagree on many weights."""
    weights = _block_folder(odd_model, tmp_path / "fp8", (128, 128))
    from ladle.model.layers.quant.fp8 import quantize_fp8_per_row

    module_name, module = _quantized_linears(_load(tmp_path / "fp8"))[0]
    exact = _checkpoint_weight(module_name, weights)
    codes, scale = quantize_fp8_per_row(exact)
    assert not torch.equal(codes.float() * scale[:, None], exact)
    assert torch.equal(module.weight_dequantized, exact)


def test_written_block_folder_loads_to_the_in_memory_block_logits(whole_block_model, tmp_path):
    out = tmp_path / "fp8-blocks"
    write_quantized_checkpoint(
        whole_block_model, out, "fp8", "hf-fp8", torch.float32, weight_block_size=32
    )
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config["weight_block_size"] == [32, 32]
    tensors = load_file(str(out / "model.safetensors"))
    scale = tensors["model.layers.0.self_attn.q_proj.weight_scale_inv"]
    assert scale.shape == (64 // 32, 64 // 32) and scale.dtype == torch.float32
    loaded = _load(out)
    reference = _load(whole_block_model)
    # The writer quantizes q, k and v apart, the in-memory method their merged matrix: the same
    # blocks when every projection is whole blocks.
    quantize_linears_(reference.model, Fp8BlockMethod(32, 32))
    assert torch.equal(paged_logits(loaded), paged_logits(reference))


def test_transformers_reads_the_written_block_folder(whole_block_model, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "fp8-blocks"
    write_quantized_checkpoint(
        whole_block_model, out, "fp8", "hf-fp8", torch.float32, weight_block_size=32
    )
    # Without a GPU transformers dequantizes fp8 checkpoints as it loads (to the config's
    # dtype, float32 here), so its Linear weights must be ladle's, bit for bit.
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    loaded = _load(out)
    checked = 0
    for module_name, module in _quantized_linears(loaded):
        base, _, leaf = module_name.rpartition(".")
        hf_weights = {
            f"{base}.{name}": hf.get_submodule(f"{base}.{name}").weight
            for name in MERGED.get(leaf, (leaf,))
        }
        expected = _checkpoint_weight(module_name, hf_weights)
        assert torch.equal(module.weight_dequantized.to(expected.dtype), expected), module_name
        checked += 1
    assert checked == 4  # the last of the two layers stays float (fp8 default)


def test_writer_refuses_blocks_that_other_readers_cannot_load(odd_model, tmp_path):
    with pytest.raises(ValueError, match="intermediate_size 200 is not a multiple of .* 32"):
        write_quantized_checkpoint(odd_model, tmp_path / "a", "fp8", weight_block_size=32)
    assert not (tmp_path / "a").exists()
    with pytest.raises(ValueError, match="applies to fp8"):
        write_quantized_checkpoint(odd_model, tmp_path / "b", "int4", weight_block_size=32)


def test_quantize_command_writes_blocks_and_refuses_bad_ones(whole_block_model, tmp_path):
    from ladle.cli.main import main

    out = tmp_path / "cli"
    argv = ["quantize", whole_block_model, str(out), "--method", "fp8", "--dtype", "float32"]
    assert main(argv + ["--weight-block-size", "32"]) == 0
    assert isinstance(_quantized_linears(_load(out))[0][1].quant_method, Fp8BlockMethod)
    assert main(argv[:2] + [str(tmp_path / "x"), *argv[3:], "--weight-block-size", "48"]) == 2
    assert (
        main(argv[:2] + [str(tmp_path / "y"), "--method", "int8", "--weight-block-size", "32"]) == 2
    )


def _edit_config(path: Path, **changes) -> None:
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"].update(changes)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "block,message",
    [
        ([128, 100], "weight_block_size=\\[128, 100\\]"),
        ([128], "weight_block_size=\\[128\\] is not \\[rows, inputs\\]"),
        ("128x128", "weight_block_size='128x128'"),
    ],
)
def test_bad_weight_block_size_is_named(odd_model, tmp_path, block, message):
    _block_folder(odd_model, tmp_path / "fp8", (128, 128))
    _edit_config(tmp_path / "fp8", weight_block_size=block)
    with pytest.raises(ModelLoadError, match=message):
        _load(tmp_path / "fp8")


def test_block_scale_of_the_wrong_shape_names_the_tensor(odd_model, tmp_path):
    _block_folder(odd_model, tmp_path / "fp8", (128, 128))
    # The config says 64 x 64 blocks; the tensors hold 128 x 128 ones.
    _edit_config(tmp_path / "fp8", weight_block_size=[64, 64])
    with pytest.raises(ModelLoadError, match=r"weight_scale_inv' has shape .*64x64 blocks"):
        _load(tmp_path / "fp8")


def test_cublas_takes_only_whole_128_blocks():
    """cuBLASLt's recipe holds one scale per 128 x 128 block: canonical scales that are not
    (another block size, or a merged q/k/v whose first part ends mid-block) stay on ladle's
    grouped kernel rather than be rounded to blocks."""
    from ladle.model.layers.quant.fp8_block import cublas_weight_scales

    weight = torch.randn(256, 1024) * 0.05
    scale = Fp8BlockMethod(128, 128).quantize(weight)["weight_scale"]
    blocks = cublas_weight_scales(scale, 128, 128)
    # [K/128 = 8, N/128 = 2], column-major, each block's own scale.
    assert blocks.shape == (8, 2) and blocks.stride() == (1, 8)
    assert torch.equal(blocks[:, 1], scale[128]) and torch.equal(blocks[:, 0], scale[0])
    assert (
        cublas_weight_scales(Fp8BlockMethod(64, 64).quantize(weight)["weight_scale"], 64, 64)
        is None
    )
    # K/128 not a multiple of 4: torch 2.11 takes no such weight scales.
    odd = Fp8BlockMethod(128, 128).quantize(torch.randn(256, 640))["weight_scale"]
    assert cublas_weight_scales(odd, 128, 128) is None
    # q of 192 rows and k of 64, quantized apart (as a checkpoint stores them), then merged:
    # rows 128-191 and 192-255 have different scales inside one 128-row block.
    parts = [Fp8BlockMethod(128, 128).quantize(torch.randn(rows, 1024))["weight_scale"]
             for rows in (192, 64)]  # fmt: skip
    assert cublas_weight_scales(torch.cat(parts), 128, 128) is None
