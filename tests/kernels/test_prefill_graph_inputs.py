"""kernels/prefill_graph_inputs.py against its torch reference (PrefillGraphs.fill_inputs_with
_torch): every static buffer equal after a step, for awkward layouts, with stale values left in
the buffers by an earlier, larger step. On CUDA, or on the CPU under Triton's interpreter."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA, or TRITON_INTERPRET=1 on the CPU",
)


def _prefill_graphs(max_blocks_per_seq: int):
    from ladle.worker.prefill_graphs import PrefillGraphs

    graphs = PrefillGraphs(
        forward=None,
        max_blocks_per_seq=max_blocks_per_seq,
        block_size=16,
        device=torch.device(DEVICE),
        max_num_tokens=4096,
    )
    graphs.static = graphs._allocate_static()
    return graphs


def _step(generator, query_lens, width, ids_dtype):
    from ladle.attention.metadata import AttentionMetadata

    num_tokens = sum(query_lens)
    starts = [0]
    for length in query_lens:
        starts.append(starts[-1] + length)
    cached = torch.randint(0, 200, (len(query_lens),), generator=generator).tolist()
    seq_lens = [length + prefix for length, prefix in zip(query_lens, cached)]

    def ints(high, *shape, dtype=torch.int64):
        return torch.randint(1, high, shape, generator=generator, dtype=dtype).to(DEVICE)

    metadata = AttentionMetadata(
        slot_mapping=ints(10_000, num_tokens),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE),
        block_tables=ints(5_000, len(query_lens), width, dtype=torch.int32),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_size=16,
        query_start_loc_host=starts,
        seq_lens_host=seq_lens,
    )
    return ints(30_000, num_tokens, dtype=ids_dtype), ints(4_000, num_tokens), metadata


def _static_buffers(graphs):
    static = graphs.static
    return [
        static.input_ids, static.positions, static.slot_mapping, static.query_start_loc,
        static.seq_lens, static.block_tables,
    ]


@pytest.mark.parametrize(
    "query_lens,width,bucket",
    [
        ([5], 3, (16, 2)),  # a batch-1 verify step
        ([5, 5, 3, 1], 7, (32, 8)),  # verify steps beside a decode
        ([1, 1, 1, 200, 1], 20, (256, 8)),  # decodes beside a prompt chunk
        ([1000], 64, (1024, 2)),  # one padding request of 24 tokens
        ([3, 3], 40, (2048, 4)),  # two padding requests of ~1,000 tokens each
    ],
)
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_one_launch_writes_what_the_torch_calls_write(query_lens, width, bucket, ids_dtype):
    from ladle.kernels.prefill_graph_inputs import fill_prefill_inputs

    generator = torch.Generator().manual_seed(len(query_lens) * 7 + width)
    reference, kernel = _prefill_graphs(256), _prefill_graphs(256)  # buckets to 4,096 tokens
    # Stale values everywhere, as a larger earlier step leaves them.
    for reference_buffer, kernel_buffer in zip(_static_buffers(reference), _static_buffers(kernel)):
        stale = torch.randint(7, 9_000, reference_buffer.shape, generator=generator)
        reference_buffer.copy_(stale)
        kernel_buffer.copy_(stale)
    input_ids, positions, metadata = _step(generator, query_lens, width, ids_dtype)
    reference.fill_inputs_with_torch(bucket, input_ids, positions, metadata)
    static = kernel.static
    fill_prefill_inputs(
        static.input_ids, static.positions, static.slot_mapping, static.query_start_loc,
        static.seq_lens, static.block_tables, input_ids, positions, metadata.slot_mapping,
        metadata.query_start_loc, metadata.seq_lens, metadata.block_tables, *bucket,
    )
    names = ["input_ids", "positions", "slot_mapping", "query_start_loc", "seq_lens", "tables"]
    padded_tokens, padded_reqs = bucket
    extents = [padded_tokens] * 3 + [padded_reqs + 1, padded_reqs, padded_reqs]
    for name, extent, expected, got in zip(
        names, extents, _static_buffers(reference), _static_buffers(kernel)
    ):
        assert torch.equal(got[:extent].cpu(), expected[:extent].cpu()), name
