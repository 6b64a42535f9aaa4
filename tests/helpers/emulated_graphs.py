"""CUDA graphs emulated on the CPU, so CPU tests and scripts can take the graph paths.

install_emulated_graphs(runner) gives a CPU ModelRunner a DecodeGraphs whose "graphs" run the
model eagerly on the graphs' static buffers: a step then goes through DecodeGraphs.run (its
copies into the static buffers, the padding rows) and the runner's graph-path code, as on the
GPU, where only a real replay can show that path's mistakes. With prefill=True small steps with
longer queries (prompt chunks, speculative verify steps) replay emulated prefill graphs too
(PrefillGraphs.run: the padding requests, the copies into its buffers).
"""

from __future__ import annotations

import torch

from ladle.attention.metadata import AttentionMetadata
from ladle.worker.cuda_graphs import DecodeGraphs
from ladle.worker.prefill_graphs import PrefillGraphs


def _replay_eagerly(runner, static, num_tokens, starts, block_size, output, **launches) -> None:
    """Run the model eagerly over the first num_tokens tokens of a graph's static buffers, the
    requests' query offsets `starts` (host), their context lengths read back, into output."""
    num_reqs = len(starts) - 1
    seq_lens = static.seq_lens[:num_reqs]
    metadata = AttentionMetadata(
        slot_mapping=static.slot_mapping[:num_tokens],
        query_start_loc=static.query_start_loc[: num_reqs + 1],
        seq_lens=seq_lens,
        block_tables=static.block_tables[:num_reqs],
        max_query_len=max(b - a for a, b in zip(starts, starts[1:])),
        max_seq_len=int(seq_lens.max()),
        block_size=block_size,
        query_start_loc_host=starts,
        seq_lens_host=seq_lens.tolist(),
        **launches,
    )
    hidden = runner.model(
        static.input_ids[:num_tokens], static.positions[:num_tokens], runner.kv_caches, metadata
    )
    output.copy_(hidden)


class EmulatedGraph:
    """Stands in for a captured CUDA graph on the CPU: replay() runs the model eagerly on the
    graphs' static buffers (the context lengths read back from them) into a fixed output."""

    def __init__(self, runner, graphs: DecodeGraphs, batch_size: int) -> None:
        self.runner, self.graphs, self.batch_size = runner, graphs, batch_size
        self.output = torch.zeros(batch_size, runner.arch.hidden_size, dtype=runner.dtype)

    def replay(self) -> None:
        size = self.batch_size
        _replay_eagerly(
            self.runner, self.graphs.static, size, list(range(size + 1)),
            self.graphs.block_size, self.output,
        )


class EmulatedPrefillGraph:
    """A prefill bucket's stand-in: replay() runs the model eagerly on the prefill graphs' static
    buffers, the layout (real and padding requests) read back from them, with the launches a
    captured template takes (graph_launches, the bucket's sizes)."""

    def __init__(self, runner, prefill: PrefillGraphs, bucket: tuple[int, int]) -> None:
        self.runner, self.prefill, self.bucket = runner, prefill, bucket
        self.output = torch.zeros(bucket[0], runner.arch.hidden_size, dtype=runner.dtype)

    def replay(self) -> None:
        static, (num_tokens, num_reqs) = self.prefill.static, self.bucket
        _replay_eagerly(
            self.runner, static, num_tokens, static.query_start_loc[: num_reqs + 1].tolist(),
            self.prefill.block_size, self.output,
            graph_launches=True, launch_num_tokens=num_tokens, launch_num_reqs=num_reqs,
        )


def install_emulated_graphs(worker, prefill: bool = False) -> None:
    """Give a CPU worker's runner decode "graphs" (EmulatedGraph) so its steps take the graph
    path; with prefill, prefill "graphs" (EmulatedPrefillGraph) as well."""
    runner = worker
    graphs = worker._graph_buckets()
    if prefill and graphs.prefill is not None:
        graphs.prefill.static = graphs.prefill._allocate_static()
        for bucket in graphs.prefill.buckets:
            emulated = EmulatedPrefillGraph(runner, graphs.prefill, bucket)
            graphs.prefill._graphs[bucket] = emulated
            graphs.prefill._outputs[bucket] = emulated.output
    else:
        graphs.prefill = None  # prompt steps run eagerly here
    graphs.static = graphs._allocate_static()
    for batch_size in graphs.batch_sizes:
        graph = EmulatedGraph(runner, graphs, batch_size)
        graphs._graphs[batch_size] = graph
        graphs._outputs[batch_size] = graph.output
    worker.runner.graph_buckets = graphs
