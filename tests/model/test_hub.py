"""Hub model ids: a hub-layout cache built here is found offline (model, tokenizer, revision),
and an unreachable hub or a missing model gives an error naming the model and the reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.hub import resolve_hub_model

REPO_ID = "tiny-org/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def build_hub_cache(cache_dir: Path, model_folder: str, revision: str = "main") -> Path:
    """Lay the folder out as huggingface_hub's cache does: blobs, snapshots/<commit>, refs."""
    repo = cache_dir / ("models--" + REPO_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for file in Path(model_folder).iterdir():
        blob = repo / "blobs" / f"blob-{file.name}"
        blob.parent.mkdir(exist_ok=True)
        shutil.copy(file, blob)
        (snapshot / file.name).symlink_to(Path("../../blobs") / blob.name)
    (repo / "refs").mkdir()
    (repo / "refs" / revision).write_text(COMMIT)
    return snapshot


def test_hub_id_loads_offline_from_a_hub_layout_cache(
    tiny_model_path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ladle import LLM, SamplingParams

    local = tiny_model_path("llama")
    snapshot = build_hub_cache(tmp_path / "hub", local, revision="v1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_hub_model(REPO_ID, "v1", tmp_path / "hub") == snapshot

    params = SamplingParams(max_tokens=5, temperature=0.0)
    from_hub = LLM(REPO_ID, revision="v1", download_dir=str(tmp_path / "hub"), dtype="float32")
    from_folder = LLM(local, dtype="float32")
    prompt = "hello world"
    hub_output = from_hub.generate(prompt, params, use_tqdm=False)[0]
    folder_output = from_folder.generate(prompt, params, use_tqdm=False)[0]
    assert hub_output.prompt_token_ids == folder_output.prompt_token_ids
    assert hub_output.outputs[0].token_ids == folder_output.outputs[0].token_ids
    assert len(hub_output.outputs[0].token_ids) == 5
    assert torch.is_tensor(next(from_hub.engine.executor.worker.model.parameters()))


def test_offline_and_not_cached_names_the_model(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match=r"'nobody/absent'.*HF_HUB_OFFLINE"):
        resolve_hub_model("nobody/absent", None, tmp_path / "empty")


def test_unreachable_hub_names_the_model_and_reason(tmp_path: Path, monkeypatch) -> None:
    # Port 9 on loopback (discard) refuses at once: the hub is unreachable, quickly.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ModelLoadError, match=r"cannot download model 'nobody/absent'") as info:
        resolve_hub_model("nobody/absent", None, tmp_path / "empty")
    assert "unreachable" in str(info.value)


def test_cached_repo_without_safetensors_is_refused(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "bin_only"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "pytorch_model.bin").write_bytes(b"x")
    build_hub_cache(tmp_path / "hub", str(folder))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        ModelLoadError, match=r"'tiny-org/tiny-llama'.*no config.json with \*\.safetensors"
    ):
        resolve_hub_model(REPO_ID, None, tmp_path / "hub")
