"""The direct safetensors reader (reader threads, pieces, device copies) yields exactly what the
memory-mapped reader does: every tensor, bit for bit, whatever the piece size cuts."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.safetensors import iter_safetensors_weights
from ladle.model.loader.safetensors_direct import iter_safetensors_on_device

CPU = torch.device("cpu")


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(37, 19, generator=generator).to(torch.bfloat16),
        "model.norm.weight": torch.randn(19, generator=generator),
        "model.layers.0.mlp.down_proj.weight": torch.randn(5, 3, generator=generator).half(),
        "model.layers.0.scale": torch.tensor(2.5),  # a 0-d tensor
        "model.layers.0.empty": torch.empty(0, 4),
        "model.layers.1.g_idx": torch.arange(13, dtype=torch.int32),
        "model.layers.1.mask": torch.rand(7, generator=generator) > 0.5,
        "model.layers.1.fp8": torch.randn(6, 4, generator=generator).to(torch.float8_e4m3fn),
    }


@pytest.fixture
def files(tmp_path):
    paths = []
    for index in range(2):
        path = tmp_path / f"model-{index:05d}.safetensors"
        save_file(_tensors(index), str(path), metadata={"format": "pt"})
        paths.append(path)
    return paths


def _as_dict(items) -> dict[str, torch.Tensor]:
    # Clone as the loader's copy does: a yielded tensor is the caller's to keep or copy.
    return {name: tensor.clone() for name, tensor in items}


def _assert_same(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].dtype == tensor.dtype and ours[name].shape == tensor.shape, name
        assert torch.equal(
            ours[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)
        ), name


@pytest.mark.parametrize("piece_bytes", [7, 64, 1 << 20])
def test_every_tensor_arrives_bit_for_bit(files, piece_bytes):
    ours = _as_dict(iter_safetensors_on_device(files, CPU, piece_bytes=piece_bytes))
    _assert_same(ours, _as_dict(iter_safetensors_weights(files)))
    assert len(ours) == 8  # both files hold the same names: the second's win in either dict


def test_only_wanted_tensors_are_read(files):
    wanted = lambda name: ".layers.1." in name  # noqa: E731
    names = [name for name, _ in iter_safetensors_on_device(files, CPU, wanted, piece_bytes=16)]
    assert names and all(".layers.1." in name for name in names)
    assert len(names) == 6  # three of each file


def test_unknown_dtypes_go_to_the_fallback(tmp_path, files):
    odd = tmp_path / "odd.safetensors"
    save_file({"odd": torch.arange(4, dtype=torch.int32).to(torch.uint16)}, str(odd))
    with pytest.raises(ModelLoadError, match="dtype"):
        list(iter_safetensors_on_device([odd], CPU))
    fallback = lambda file: iter_safetensors_weights([file])  # noqa: E731
    ours = _as_dict(iter_safetensors_on_device([files[0], odd], CPU, fallback=fallback))
    _assert_same(ours, _as_dict(iter_safetensors_weights([files[0], odd])))


def test_a_truncated_file_names_itself(tmp_path, files):
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(files[0].read_bytes()[:-40])
    with pytest.raises(ModelLoadError, match="cut.safetensors"):
        list(iter_safetensors_on_device([cut], CPU, piece_bytes=32))
