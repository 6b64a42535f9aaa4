"""Safetensors read straight onto the GPU (pinned pieces, copies that do not block) load the
same parameters, bit for bit, as the memory-mapped reader, and the engine gives the same tokens."""

from __future__ import annotations

import pytest
import torch

from ladle.attention.backend import get_attention_backend
from ladle.config import ModelConfig
from ladle.model.loader import load_model
from ladle.model.loader.random_checkpoint import write_random_checkpoint
from ladle.model.loader.safetensors import find_safetensors_files, iter_safetensors_weights
from ladle.model.loader.safetensors_direct import iter_safetensors_on_device

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA = torch.device("cuda")


def test_direct_reader_matches_the_mapped_one_on_cuda(tiny_model_path):
    files = find_safetensors_files(tiny_model_path("qwen3", sharded=True))
    ours = {n: t.clone() for n, t in iter_safetensors_on_device(files, CUDA, piece_bytes=4096)}
    theirs = dict(iter_safetensors_weights(files))
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert ours[name].device.type == "cuda"
        assert torch.equal(ours[name].cpu(), tensor), name


def test_load_model_is_the_same_with_and_without_direct_reads(tmp_path, monkeypatch):
    folder = write_random_checkpoint("tiny-llama", tmp_path / "ckpt", shard_bytes=200_000)

    def parameters(direct: str) -> dict[str, torch.Tensor]:
        monkeypatch.setenv("LADLE_DIRECT_SAFETENSORS", direct)
        loaded = load_model(
            ModelConfig(model=str(folder)), CUDA, torch.bfloat16, get_attention_backend(CUDA)
        )
        return {name: p.detach().clone() for name, p in loaded.model.named_parameters()}

    direct, mapped = parameters("1"), parameters("0")
    assert direct.keys() == mapped.keys()
    for name, tensor in mapped.items():
        assert torch.equal(direct[name], tensor), name
