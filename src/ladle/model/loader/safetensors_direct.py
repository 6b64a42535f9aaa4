"""safetensors files read straight onto the device: reader threads fill pinned host pieces, each
piece is copied to the device without blocking, and every tensor arrives already on the device.

The plain path (safetensors.py) memory-maps each file and lets `param.copy_` pull a tensor from
the mapping: one thread faults the pages in, and the copy from pageable memory goes through the
driver's own staging. Here the file is read with `os.preadv` (which releases the GIL) by
NUM_READERS threads into NUM_SLOTS pinned pieces of PIECE_BYTES, ahead of the copies; a piece is
reused once its copy has finished (an event per piece). Host memory holds the pieces only, never
a tensor, let alone the model.

Each tensor is yielded as a view of a fresh device buffer of its own bytes, so the caller may keep
it (the loader copies it into its parameter and drops it; one tensor is the transient device
memory, the largest being the embedding). Used for float checkpoints on one CUDA rank (the loader
decides); on the CPU the same code runs with unpinned pieces and synchronous copies, which the
tests use to check it against the plain reader.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from ladle.model.loader.errors import ModelLoadError

PIECE_BYTES = 64 * 1024**2
NUM_SLOTS = 6
NUM_READERS = 4

# safetensors' dtype names; a file holding any other is left to the plain reader.
DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file: where its bytes are (absolute file offsets)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def read_entries(file: Path) -> list[TensorEntry] | None:
    """The file's tensors in file order, or None when one has a dtype DTYPES lacks."""
    with open(file, "rb") as handle:
        (header_bytes,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_bytes))
    data_start = 8 + header_bytes
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            return None
        begin, end = info["data_offsets"]
        entries.append(
            TensorEntry(name, dtype, tuple(info["shape"]), data_start + begin, data_start + end)
        )
    return sorted(entries, key=lambda entry: entry.begin)


def _read_into(fd: int, piece: torch.Tensor, offset: int, length: int) -> None:
    view = memoryview(piece.numpy())[:length]
    done = 0
    while done < length:
        count = os.preadv(fd, [view[done:]], offset + done)
        if count <= 0:
            raise OSError(f"unexpected end of file at byte {offset + done}")
        done += count


def iter_safetensors_on_device(
    files: list[Path],
    device: torch.device,
    wanted: Callable[[str], bool] | None = None,
    fallback: Callable[[Path], Iterator[tuple[str, torch.Tensor]]] | None = None,
    piece_bytes: int = PIECE_BYTES,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (checkpoint name, tensor on `device`) for every tensor of every file (only those
    `wanted` accepts). A file with a dtype this reader lacks goes to `fallback` (the plain
    reader) when given."""
    pin = device.type == "cuda"
    pieces = [torch.empty(piece_bytes, dtype=torch.uint8, pin_memory=pin) for _ in range(NUM_SLOTS)]
    copied: list[torch.cuda.Event | None] = [None] * NUM_SLOTS
    with ThreadPoolExecutor(NUM_READERS, thread_name_prefix="ladle-safetensors") as pool:
        for file in files:
            try:
                entries = read_entries(file)
            except (OSError, ValueError, KeyError, struct.error) as error:
                raise _unreadable(file, error) from error
            if entries is None:
                if fallback is None:
                    raise ModelLoadError(f"{str(file)!r} holds a dtype this reader lacks")
                yield from fallback(file)
                continue
            entries = [entry for entry in entries if wanted is None or wanted(entry.name)]
            yield from _stream_file(file, entries, device, pool, pieces, copied, piece_bytes)


def _stream_file(
    file: Path,
    entries: list[TensorEntry],
    device: torch.device,
    pool: ThreadPoolExecutor,
    pieces: list[torch.Tensor],
    copied: list,
    piece_bytes: int,
) -> Iterator[tuple[str, torch.Tensor]]:
    # Every piece of the file: (entry index, offset in the file, length, offset in the tensor).
    plan = [
        (index, entry.begin + start, min(piece_bytes, entry.end - entry.begin - start), start)
        for index, entry in enumerate(entries)
        for start in range(0, entry.end - entry.begin, piece_bytes)
    ]
    fd = os.open(file, os.O_RDONLY)
    try:
        reads: dict[int, Future] = {}

        def submit(number: int) -> None:
            slot = number % len(pieces)
            if copied[slot] is not None:
                copied[slot].synchronize()  # the piece's last copy has left it
                copied[slot] = None
            _, offset, length, _ = plan[number]
            reads[number] = pool.submit(_read_into, fd, pieces[slot], offset, length)

        for number in range(min(len(pieces), len(plan))):
            submit(number)
        targets: dict[int, torch.Tensor] = {}
        next_entry = 0
        for number, (index, _, length, start) in enumerate(plan):
            # Entries without bytes (empty tensors) have no piece: yield them in order.
            while next_entry < index:
                yield _empty_entry(entries[next_entry], device)
                next_entry += 1
            try:
                reads.pop(number).result()
            except OSError as error:
                raise _unreadable(file, error) from error
            entry = entries[index]
            target = targets.get(index)
            if target is None:
                target = targets[index] = torch.empty(
                    entry.end - entry.begin, dtype=torch.uint8, device=device
                )
            slot = number % len(pieces)
            target[start : start + length].copy_(pieces[slot][:length], non_blocking=True)
            if device.type == "cuda":
                copied[slot] = torch.cuda.Event()
                copied[slot].record()
            if number + len(pieces) < len(plan):
                submit(number + len(pieces))
            if start + length == entry.end - entry.begin:
                yield entry.name, targets.pop(index).view(entry.dtype).view(entry.shape)
                next_entry = index + 1
        for entry in entries[next_entry:]:
            yield _empty_entry(entry, device)
    finally:
        for future in reads.values():
            future.cancel()
        for future in reads.values():
            if not future.cancelled():
                future.exception()  # wait: the file must not close under a running read
        os.close(fd)


def _empty_entry(entry: TensorEntry, device: torch.device) -> tuple[str, torch.Tensor]:
    return entry.name, torch.empty(entry.shape, dtype=entry.dtype, device=device)


def _unreadable(file: Path, error: Exception) -> ModelLoadError:
    return ModelLoadError(f"cannot read safetensors file {str(file)!r}: {error}")
