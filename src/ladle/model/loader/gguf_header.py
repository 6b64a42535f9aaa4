"""A fast GGUF header reader: metadata and the tensor table, with the tensor data memory-mapped.

The `gguf` package's GGUFReader builds several numpy views per metadata item, which for a
49k-entry vocabulary is ~10 s on a small CPU. ladle never needs the vocabulary strings here (the
tokenizer comes from transformers and is cached), so string arrays are skipped by walking their
length prefixes, and decoded only when asked for. Numeric arrays become one numpy array each.

    header = read_gguf_header(path)
    header.fields["llama.block_count"]        -> 30
    header.tensors[0].name, .dims, .ggml_type  (dims in GGUF order: dims[0] varies fastest)
    header.tensor_bytes(tensor)                -> uint8 view of the memory map

Layout (little-endian, GGUF v2/v3): magic, version u32, tensor count u64, kv count u64, the kv
pairs, the tensor infos, padding to `general.alignment`, then the tensor data.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types.
_STRING, _ARRAY = 8, 9
_SCALAR_FORMATS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_NUMPY_TYPES = {
    0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
    6: np.float32, 7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64,
}  # fmt: skip


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF header this reader understands (names the offset)."""


@dataclass(frozen=True)
class StringArray:
    """A metadata array of strings, left undecoded: its length is known, its items on demand."""

    buffer: Any
    offset: int  # of the first string's length prefix
    count: int

    def __len__(self) -> int:
        return self.count

    def to_list(self) -> list[str]:
        """Decode every string (one Python object each: only call when they are needed)."""
        items = []
        position = self.offset
        for _ in range(self.count):
            (length,) = struct.unpack_from("<Q", self.buffer, position)
            position += 8
            items.append(bytes(self.buffer[position : position + length]).decode("utf-8"))
            position += length
        return items


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of the tensor table."""

    name: str
    dims: tuple[int, ...]  # GGUF order: dims[0] is the innermost (row length)
    ggml_type: int
    data_offset: int  # absolute, in the file
    num_bytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """The numpy/torch shape (outermost first)."""
        return tuple(reversed(self.dims))

    @property
    def num_elements(self) -> int:
        count = 1
        for dim in self.dims:
            count *= dim
        return count


class GGUFHeader:
    """The parsed header of one GGUF file and a read-only memory map of its bytes."""

    def __init__(
        self,
        path: Path,
        buffer: mmap.mmap,
        version: int,
        fields: dict[str, Any],
        tensors: list[GGUFTensorInfo],
    ) -> None:
        self.path = path
        self.version = version
        self.fields = fields
        self.tensors = tensors
        self._buffer = buffer
        self._tensors_by_name = {tensor.name: tensor for tensor in tensors}

    def tensor(self, name: str) -> GGUFTensorInfo | None:
        return self._tensors_by_name.get(name)

    def tensor_bytes(self, tensor: GGUFTensorInfo) -> np.ndarray:
        """The tensor's raw bytes as a read-only uint8 view of the memory map (no copy)."""
        return np.frombuffer(
            self._buffer, dtype=np.uint8, count=tensor.num_bytes, offset=tensor.data_offset
        )


def read_gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse a GGUF file's header. Raises GGUFFormatError (a ValueError) on malformed input and
    OSError when the file cannot be read."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            raise GGUFFormatError("the file is empty")
        buffer = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    cursor = _Cursor(buffer)
    if cursor.take(4) != GGUF_MAGIC:
        raise GGUFFormatError("no GGUF magic at offset 0")
    version = cursor.unpack("<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"GGUF version {version} (ladle reads versions 2 and 3)")
    num_tensors = cursor.unpack("<Q")
    num_fields = cursor.unpack("<Q")
    fields: dict[str, Any] = {}
    for _ in range(num_fields):
        key = cursor.string()
        fields[key] = cursor.value(cursor.unpack("<I"))
    infos = []
    for _ in range(num_tensors):
        name = cursor.string()
        num_dims = cursor.unpack("<I")
        if num_dims > 8:
            raise GGUFFormatError(f"tensor {name!r} claims {num_dims} dimensions")
        dims = struct.unpack_from(f"<{num_dims}Q", buffer, cursor.position)
        cursor.position += 8 * num_dims
        ggml_type = cursor.unpack("<I")
        relative_offset = cursor.unpack("<Q")
        infos.append((name, dims, ggml_type, relative_offset))
    alignment = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cursor.position // alignment) * alignment
    tensors = []
    for name, dims, ggml_type, relative_offset in infos:
        try:
            block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise GGUFFormatError(f"tensor {name!r} has unknown type id {ggml_type}") from None
        num_elements = 1
        for dim in dims:
            num_elements *= dim
        num_bytes = num_elements // block_size * type_size
        start = data_start + relative_offset
        if start + num_bytes > len(buffer):
            raise GGUFFormatError(
                f"tensor {name!r} ends at byte {start + num_bytes}, past the end of the file "
                f"({len(buffer)} bytes)"
            )
        tensors.append(GGUFTensorInfo(name, tuple(dims), ggml_type, start, num_bytes))
    return GGUFHeader(path, buffer, version, fields, tensors)


class _Cursor:
    """Reads little-endian values from a buffer, raising GGUFFormatError past its end."""

    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer = buffer
        self.position = 0

    def take(self, num_bytes: int) -> bytes:
        end = self.position + num_bytes
        if end > len(self.buffer):
            raise GGUFFormatError(
                f"the header ends early (needed byte {end}, have {len(self.buffer)})"
            )
        data = self.buffer[self.position : end]
        self.position = end
        return data

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.position + size > len(self.buffer):
            raise GGUFFormatError(f"the header ends early at byte {self.position}")
        (value,) = struct.unpack_from(fmt, self.buffer, self.position)
        self.position += size
        return value

    def string(self) -> str:
        length = self.unpack("<Q")
        try:
            return self.take(length).decode("utf-8")
        except UnicodeDecodeError as error:
            raise GGUFFormatError(f"a string at byte {self.position} is not UTF-8") from error

    def value(self, value_type: int) -> Any:
        if value_type in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[value_type])
        if value_type == _STRING:
            return self.string()
        if value_type != _ARRAY:
            raise GGUFFormatError(f"unknown metadata type {value_type} at byte {self.position}")
        item_type = self.unpack("<I")
        count = self.unpack("<Q")
        if item_type in _NUMPY_TYPES:
            dtype = np.dtype(_NUMPY_TYPES[item_type])
            num_bytes = count * dtype.itemsize
            if self.position + num_bytes > len(self.buffer):
                raise GGUFFormatError(f"an array at byte {self.position} runs past the file end")
            array = np.frombuffer(self.buffer, dtype=dtype, count=count, offset=self.position)
            self.position += num_bytes
            return array
        if item_type == _STRING:
            start = self.position
            self._skip_strings(count)
            return StringArray(self.buffer, start, count)
        # Nested arrays do not occur in llama.cpp's files; read them as plain lists.
        return [self.value(item_type) for _ in range(count)]

    def _skip_strings(self, count: int) -> None:
        # Only the length prefixes are read: no Python string is built per vocabulary entry.
        buffer, position, unpack_from = self.buffer, self.position, struct.unpack_from
        end = len(buffer)
        for _ in range(count):
            if position + 8 > end:
                raise GGUFFormatError(f"a string array runs past the file end at byte {position}")
            position += 8 + unpack_from("<Q", buffer, position)[0]
        if position > end:
            raise GGUFFormatError("a string array runs past the file end")
        self.position = position
