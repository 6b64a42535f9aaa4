"""Hugging Face folders: config.json plus *.safetensors weights, streamed one tensor at a time.

Only safetensors are read (never torch.load / pickle), and each file is memory-mapped, so peak
host memory is one tensor, not one checkpoint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from ladle.model.loader.errors import ModelLoadError

INDEX_FILE = "model.safetensors.index.json"


def read_hf_config(model_dir: str | os.PathLike, overrides: dict | None = None) -> dict:
    """config.json as a dict, with `overrides` merged over its top-level keys."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"model folder {str(model_dir)!r} has no config.json")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelLoadError(f"cannot read {str(path)!r}: {error}") from error
    if not isinstance(config, dict):
        raise ModelLoadError(f"{str(path)!r} is not a JSON object")
    config.update(overrides or {})
    return config


def find_safetensors_files(model_dir: str | os.PathLike) -> list[Path]:
    """The weight files of a folder: those named by model.safetensors.index.json when it exists
    (a sharded checkpoint), else every *.safetensors file, in name order."""
    model_dir = Path(model_dir)
    index_path = model_dir / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as error:
            raise ModelLoadError(f"cannot read shard index {str(index_path)!r}: {error}") from error
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [str(file) for file in files if not file.is_file()]
        if missing:
            raise ModelLoadError(
                f"shard index {str(index_path)!r} names missing file(s): {', '.join(missing)}"
            )
        return files
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"model folder {str(model_dir)!r} has no *.safetensors files")
    return files


def check_safetensors_files(files: list[Path]) -> None:
    """Parse every file's header before any weight is allocated, so a truncated or corrupt
    download fails fast (safetensors checks the header covers the file exactly)."""
    for file in files:
        try:
            with safe_open(file, framework="pt", device="cpu") as reader:
                reader.keys()
        except Exception as error:  # noqa: BLE001 - SafetensorError, OSError, ... all mean "bad file"
            raise ModelLoadError(
                f"safetensors file {str(file)!r} is truncated or corrupt: {error}"
            ) from error


def safetensors_tensor_names(files: list[Path]) -> list[str]:
    """Every tensor's name, in the order iter_safetensors_weights yields them (headers only)."""
    names: list[str] = []
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as reader:
            names += reader.keys()
    return names


def iter_safetensors_weights(
    files: list[Path], wanted: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (checkpoint name, CPU tensor) for every tensor of every file, one at a time; with
    `wanted`, only the tensors it accepts are read (a pipeline stage skips the others' layers)."""
    for file in files:
        try:
            with safe_open(file, framework="pt", device="cpu") as reader:
                for name in reader.keys():
                    if wanted is None or wanted(name):
                        yield name, reader.get_tensor(name)
        except ModelLoadError:
            raise
        except Exception as error:  # noqa: BLE001
            raise ModelLoadError(f"cannot read safetensors file {str(file)!r}: {error}") from error
