"""Hugging Face Hub model ids ('Qwen/Qwen3-0.6B'): find them in the cache or download them.

    resolve_hub_model(repo_id, revision=None, download_dir=None) -> local snapshot folder

Only what ladle reads is fetched (config, tokenizer files, chat template, safetensors), through
`huggingface_hub.snapshot_download`, which shows a progress bar and honours the usual variables:
HF_TOKEN (gated and private models), HF_HUB_OFFLINE=1 (never touch the network), HF_HOME /
HF_HUB_CACHE (where the cache lives), HF_ENDPOINT (a mirror). `download_dir` replaces the cache
folder, as vLLM's --download-dir does. The cache is tried first, so a cached model starts
without a network round trip. Every failure is a ModelLoadError naming the model and the reason.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ladle.model.loader.errors import ModelLoadError

# What ladle can use from a model repository; everything else (.bin, .pt, onnx, gguf shards of
# other quantizations, images) is left on the hub.
ALLOWED_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.jinja",
    "tokenizer*",
    "*.model",  # sentencepiece
    "*.tiktoken",
    "*.txt",  # merges.txt
]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_hub_id(name: str) -> bool:
    """'org/name' that is not a local path."""
    return bool(_HUB_ID.match(name)) and not Path(name).expanduser().exists()


def resolve_hub_model(
    repo_id: str, revision: str | None = None, download_dir: str | os.PathLike | None = None
) -> Path:
    """The local folder of `repo_id` at `revision`, downloaded first when not in the cache."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache_dir = str(Path(download_dir).expanduser()) if download_dir else None
    where = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    options = dict(revision=revision, cache_dir=cache_dir, allow_patterns=ALLOWED_PATTERNS)
    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True, **options))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError):
        folder = None
    except HFValidationError as error:
        raise ModelLoadError(f"model {repo_id!r} is not a valid Hugging Face id: {error}") from None
    if folder is None and _hub_offline():
        raise ModelLoadError(
            f"model {where} is not in the Hugging Face cache "
            f"({cache_dir or 'the default cache'}) and HF_HUB_OFFLINE is set, so it cannot "
            "be downloaded; unset HF_HUB_OFFLINE, or pass a local folder or .gguf file"
        )
    # A cached snapshot without weights may be a partial download: complete it (when online).
    if (folder is None or not _has_weights(folder)) and not _hub_offline():
        try:
            folder = Path(snapshot_download(repo_id, **options))
        except GatedRepoError:
            raise ModelLoadError(
                f"model {where} is gated: accept its terms on huggingface.co and set HF_TOKEN "
                "to a token of that account"
            ) from None
        except RepositoryNotFoundError:
            raise ModelLoadError(
                f"model {where} does not exist on the Hugging Face Hub (or is private: set "
                "HF_TOKEN)"
            ) from None
        except RevisionNotFoundError:
            raise ModelLoadError(
                f"model {repo_id!r} has no revision {revision!r} on the Hugging Face Hub"
            ) from None
        except LocalEntryNotFoundError as error:
            raise ModelLoadError(
                f"cannot download model {where}: the Hugging Face Hub is unreachable and the "
                f"model is not cached ({_reason(error)}). Check the network or HF_ENDPOINT, or "
                "pass a local folder or .gguf file"
            ) from None
        except Exception as error:  # noqa: BLE001 - HTTP, disk-full, proxy errors: all named
            raise ModelLoadError(
                f"cannot download model {where} from the Hugging Face Hub: "
                f"{type(error).__name__}: {_reason(error)}"
            ) from None
    if not _has_weights(folder):
        raise ModelLoadError(
            f"model {where} has no config.json with *.safetensors weights (ladle never loads "
            "PyTorch pickle .bin files); use a repository with safetensors weights, or a .gguf "
            "file"
        )
    return folder


def _has_weights(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def _reason(error: BaseException) -> str:
    # huggingface_hub's messages run to several lines; the first names the problem.
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
