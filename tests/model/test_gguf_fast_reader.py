"""The fast GGUF header reader and the torch dequantizer against the `gguf` package's own
GGUFReader and numpy dequantize (the reference), on files and bytes made here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize as numpy_dequantize

from ladle.model.loader.errors import ModelLoadError
from ladle.model.loader.gguf import open_gguf
from ladle.model.loader.gguf_dequant import TORCH_DEQUANTIZED_TYPES, dequantize
from ladle.model.loader.gguf_header import StringArray, read_gguf_header


def test_header_matches_gguf_reader(tmp_path: Path) -> None:
    path = tmp_path / "meta.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_uint32("a.u32", 7)
    writer.add_int64("a.i64", -5)
    writer.add_float32("a.f32", 0.25)
    writer.add_float64("a.f64", 1e-300)
    writer.add_bool("a.bool", True)
    writer.add_string("a.str", "héllo")
    vocabulary = [f"tok{i}" for i in range(1000)] + ["", "∑"]
    writer.add_array("tokenizer.ggml.tokens", vocabulary)
    writer.add_array("tokenizer.ggml.scores", [float(i) / 3 for i in range(50)])
    writer.add_array("a.ints", [1, -2, 3])
    rng = np.random.default_rng(0)
    writer.add_tensor("x.weight", rng.standard_normal((3, 64)).astype(np.float32))
    writer.add_tensor("y.weight", rng.standard_normal((5,)).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    reference = GGUFReader(path)
    header = read_gguf_header(path)
    # GGUFReader lists the file's own counters (GGUF.version, ...) as fields too.
    reference_fields = {k: f for k, f in reference.fields.items() if not k.startswith("GGUF.")}
    assert set(header.fields) == set(reference_fields)
    for key, field in reference_fields.items():
        ours = header.fields[key]
        expected = field.contents()
        if isinstance(ours, StringArray):
            assert ours.to_list() == expected
        elif isinstance(ours, np.ndarray):
            np.testing.assert_array_equal(ours, np.asarray(expected))
        else:
            assert ours == pytest.approx(expected), key
    assert [t.name for t in header.tensors] == [t.name for t in reference.tensors]
    for ours, theirs in zip(header.tensors, reference.tensors):
        assert ours.dims == tuple(int(d) for d in theirs.shape)
        assert ours.ggml_type == int(theirs.tensor_type)
        np.testing.assert_array_equal(
            header.tensor_bytes(ours), np.asarray(theirs.data).view(np.uint8).reshape(-1)
        )


@pytest.mark.parametrize("qtype", sorted(TORCH_DEQUANTIZED_TYPES, key=int), ids=lambda q: q.name)
@pytest.mark.parametrize("num_blocks", [1, 7])
def test_torch_dequantize_matches_gguf(qtype: GGMLQuantizationType, num_blocks: int) -> None:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype) * 10 + num_blocks)
    raw = rng.integers(0, 256, size=num_blocks * type_size, dtype=np.uint8)
    if qtype not in (GGMLQuantizationType.F32, GGMLQuantizationType.BF16):
        # Keep every float16 field finite and small: random bytes make inf and nan scales.
        blocks = raw.reshape(num_blocks, type_size)
        halves = rng.uniform(-2, 2, size=(num_blocks, type_size // 2)).astype(np.float16)
        half_bytes = halves.view(np.uint8).reshape(num_blocks, -1)
        if qtype == GGMLQuantizationType.Q6_K:
            blocks[:, 208:210] = half_bytes[:, :2]
        elif qtype == GGMLQuantizationType.F16:
            blocks[:] = half_bytes[:, :type_size]
        else:
            blocks[:, 0:4] = half_bytes[:, :4]  # d (and m / dmin where the type has one)
    else:
        raw = rng.standard_normal(num_blocks * block_size).astype(
            np.float32 if qtype == GGMLQuantizationType.F32 else np.float32
        )
        if qtype == GGMLQuantizationType.BF16:
            raw = (raw.view(np.uint32) >> 16).astype(np.uint16)
        raw = raw.view(np.uint8)
    expected = np.asarray(numpy_dequantize(raw, qtype), dtype=np.float32).reshape(-1)
    actual = dequantize(raw, int(qtype), (num_blocks * block_size,))
    torch.testing.assert_close(actual, torch.from_numpy(expected), rtol=1e-5, atol=1e-5)


def test_corrupt_header_names_the_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (1).to_bytes(8, "little") * 2)
    with pytest.raises(ModelLoadError, match="bad.gguf.*truncated or corrupt.*ends early"):
        open_gguf(path)
    path.write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(ModelLoadError, match="no GGUF magic"):
        open_gguf(path)
