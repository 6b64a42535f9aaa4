"""Hugging Face folders: config.json plus *.safetensors weights, streamed one tensor at a time.

Only safetensors are read (never torch.load / pickle). Each file is memory-mapped and every
tensor yielded is a view of the mapping, not a copy: a tensor-parallel rank that narrows a weight
to its own rows or columns copies only those to its device, and the ranks of one host share the
page cache instead of each holding a copy of every tensor (a 70B checkpoint is 141 GB). The
mapping is private (copy on write), so a loader that edits a tensor in place changes its own
pages, never the file.
"""

from __future__ import annotations

import json
import mmap
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
    """Yield (checkpoint name, CPU tensor) for every tensor of every file, one at a time, each a
    view of the file's mapping (see the module docstring); with `wanted`, only the tensors it
    accepts are read (a pipeline stage skips the others' layers)."""
    for file in files:
        try:
            with safe_open(file, framework="pt", device="cpu") as reader:
                names = [name for name in reader.keys() if wanted is None or wanted(name)]
                views = _mapped_views(file)
                for name in names:
                    view = views.get(name)
                    yield name, view if view is not None else reader.get_tensor(name)
        except ModelLoadError:
            raise
        except Exception as error:  # noqa: BLE001
            raise ModelLoadError(f"cannot read safetensors file {str(file)!r}: {error}") from error


# safetensors' dtype names; a tensor of another dtype is read by safetensors itself.
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip


def _mapped_views(file: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the file whose dtype torch reads from a buffer, as a view of one private
    mapping of the file (the header was checked by safe_open: offsets lie inside the file)."""
    with open(file, "rb") as handle:
        header_size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(header_size))
        if os.fstat(handle.fileno()).st_size == 8 + header_size:
            return {}  # no tensor data (mmap refuses an empty range)
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    data_start = 8 + header_size
    views = {}
    for name, entry in header.items():
        dtype = _DTYPES.get(entry.get("dtype")) if isinstance(entry, dict) else None
        if dtype is None:
            continue  # "__metadata__", or a dtype left to safetensors
        start, end = entry["data_offsets"]
        count = (end - start) // dtype.itemsize
        if count == 0:
            views[name] = torch.empty(entry["shape"], dtype=dtype)
            continue
        flat = torch.frombuffer(mapped, dtype=dtype, count=count, offset=data_start + start)
        views[name] = flat.view(entry["shape"])
    return views
