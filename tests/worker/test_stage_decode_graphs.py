"""A pipeline stage's decode graphs, emulated on the CPU: what the stage receives lands in the
rows its graph reads, and a stage before the last gets its (hidden states, residual) back,
cut to the step's requests. The real capture and the hand-offs over NCCL run on GPUs
(tests/gpu/test_pipeline_parallel_gpu.py)."""

from __future__ import annotations

import functools

import torch

from ladle.attention.metadata import AttentionMetadata
from ladle.worker.cuda_graphs import DecodeGraphs

HIDDEN = 8


def _stage_forward(input_ids, positions, metadata, intermediate=None):
    """A stage between two others: reads the received rows, hands on a pair."""
    hidden, residual = intermediate
    return hidden * 2 + positions[:, None], hidden + residual


class _ReplayOnce:
    """A "graph" that runs the forward on the graphs' fixed buffers into fixed outputs."""

    def __init__(self, run, outputs):
        self.run, self.outputs = run, outputs

    def replay(self) -> None:
        for out, value in zip(self.outputs, self.run(), strict=True):
            out.copy_(value)


def _emulated(graphs: DecodeGraphs) -> DecodeGraphs:
    graphs.static = static = graphs._allocate_static()
    for size in graphs.batch_sizes:
        metadata = graphs._metadata(size)
        hidden, residual = static.stage_input
        run = functools.partial(
            graphs.forward, static.input_ids[:size], static.positions[:size], metadata,
            (hidden[:size], residual[:size]),
        )
        outputs = (torch.zeros(size, HIDDEN), torch.zeros(size, HIDDEN))
        graphs._graphs[size] = _ReplayOnce(run, outputs)
        graphs._outputs[size] = outputs
    return graphs


def test_a_later_stage_replays_what_it_received():
    graphs = _emulated(
        DecodeGraphs(
            _stage_forward, max_batch_size=8, max_blocks_per_seq=4, block_size=16,
            device=torch.device("cpu"), stage_input=(HIDDEN, torch.float32),
        )
    )
    assert graphs.prefill is None
    num_reqs = 3  # replays the bucket of 4: one padding row
    received = [torch.randn(num_reqs, HIDDEN), torch.randn(num_reqs, HIDDEN)]
    for buffer, value in zip(graphs.stage_input_buffers(num_reqs), received, strict=True):
        buffer.copy_(value)  # what the stage's receive does, into the graph's own rows
    positions = torch.tensor([5, 9, 2])
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor([5, 9, 2]),
        query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32),
        seq_lens=torch.tensor([6, 10, 3], dtype=torch.int32),
        block_tables=torch.zeros((num_reqs, 1), dtype=torch.int32),
        max_query_len=1,
        max_seq_len=10,
        block_size=16,
        query_start_loc_host=list(range(num_reqs + 1)),
        seq_lens_host=[6, 10, 3],
    )
    hidden, residual = graphs.run(torch.zeros(num_reqs, dtype=torch.int32), positions, metadata)
    assert hidden.shape == residual.shape == (num_reqs, HIDDEN)
    torch.testing.assert_close(hidden, received[0] * 2 + positions[:, None].float())
    torch.testing.assert_close(residual, received[0] + received[1])
