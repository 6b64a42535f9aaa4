"""CUDA graphs of decode-only steps: capture once per bucketed batch size, replay every step.
Small steps with prompt tokens replay graphs of their own (prefill_graphs.py), captured here
into the same pool.

A decode step of a small model is a thousand-odd tiny kernels; launching them one by one from
Python costs far more than running them. A graph replays the whole forward with one launch.

- Buckets: 1, 2, 4, 8, then every 8 up to 64, then every 16 up to the largest batch; a batch is
  padded up to the next bucket with dummy requests (one token at position 0 of the null block 0,
  so their cache writes land where nothing reads them, and their outputs are never sampled).
- The graphs read fixed buffers (input ids, positions, cache slots, sequence lengths, block
  tables of max_model_len width); a replay copies the step's tensors into them first.
- All graphs share one memory pool and are captured largest first, so the smaller ones reuse the
  largest one's activations: the pool costs about one decode batch of activations.
- Only the model forward is captured. The logits matmul and the sampler stay eager: they read
  per-step host flags (which sampling steps to run) and only the rows that sample.
- A pipeline stage after the first reads the previous stage's hidden states and residual from
  two more fixed buffers, which the stage's receive fills before the replay; a stage before the
  last returns its (hidden states, residual) for the next. The hand-offs themselves stay outside
  the graph. Such stages capture decode steps only.

The decode attention kernel's grid depends on the batch size alone (kernels/paged_attention.py),
so one captured graph is right for any context lengths and block tables.

Graphs must not change results, so a step that fits a bucket takes the launches of its graph
even when it runs eagerly (`--enforce-eager`, the warm-up aside): eager_metadata marks it. What
can still differ is cuBLAS's kernel for another row count (a graph pads the rows, eager does
not); on the GPU tests' random models that has not flipped a greedy token.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ladle.attention.metadata import AttentionMetadata
from ladle.worker.graph_capture import CaptureTimes, capture_graph
from ladle.worker.prefill_graphs import PrefillGraphs, request_buckets_for


def graph_batch_sizes(max_batch_size: int) -> list[int]:
    """The captured batch sizes, ascending; the largest is max_batch_size itself."""
    sizes = [size for size in (1, 2, 4) if size < max_batch_size]
    sizes += list(range(8, min(64, max_batch_size) + 1, 8))
    sizes += list(range(80, max_batch_size + 1, 16))
    sizes = sorted({size for size in sizes if size < max_batch_size} | {max_batch_size})
    return sizes


def padded_batch_size(num_reqs: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds num_reqs, or None when none does."""
    for size in sizes:
        if size >= num_reqs:
            return size
    return None


@dataclass
class _StaticInputs:
    input_ids: torch.Tensor  # [max_bs] int32
    positions: torch.Tensor  # [max_bs] int64
    slot_mapping: torch.Tensor  # [max_bs] int64
    query_start_loc: torch.Tensor  # [max_bs + 1] int32, always 0..max_bs: one token a request
    seq_lens: torch.Tensor  # [max_bs] int32
    block_tables: torch.Tensor  # [max_bs, max_blocks_per_seq] int32
    # positions, slot_mapping and seq_lens are views into this one int32 buffer (int64 values
    # as word pairs), so a step's host can write all three, padding included, with one copy
    # (pack_decode_words) instead of three device-to-device copies and two fills.
    words: torch.Tensor  # [5 * max_bs] int32
    # A pipeline stage after the first: the previous stage's hidden states and residual
    # ([max_bs, hidden] each, received into before each replay); None otherwise.
    stage_input: tuple[torch.Tensor, torch.Tensor] | None = None


def decode_words_layout(max_bs: int) -> dict[str, tuple[int, int]]:
    """(first word, number of words) of each part of _StaticInputs.words."""
    return {
        "positions": (0, 2 * max_bs),
        "slot_mapping": (2 * max_bs, 2 * max_bs),
        "seq_lens": (4 * max_bs, max_bs),
    }


def pack_decode_words(
    max_bs: int, positions: np.ndarray, slot_mapping: np.ndarray, seq_lens: np.ndarray
) -> np.ndarray:
    """The host image of _StaticInputs.words for a decode step of len(positions) requests:
    the padding rows (up to max_bs) write one token at slot 0 of the null block, with a
    context of one, as DecodeGraphs.run's padding does."""
    words = np.zeros(5 * max_bs, dtype=np.int32)
    num_reqs = len(positions)
    # decode_words_layout's order, written through an int64 view of the first 4 * max_bs words
    # (positions, then slot_mapping): a step's host time is per call, so few calls.
    pairs = words[: 4 * max_bs].view(np.int64)
    pairs[:num_reqs] = positions
    pairs[max_bs : max_bs + num_reqs] = slot_mapping
    lengths = words[4 * max_bs :]
    lengths.fill(1)
    lengths[:num_reqs] = seq_lens
    return words


# (input ids, positions, metadata[, the previous pipeline stage's (hidden, residual)]) -> the
# final hidden states, or a stage before the last's (hidden states, residual).
ForwardFn = Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]]


class DecodeGraphs:
    """The captured decode graphs of one model runner and the buffers they read."""

    def __init__(
        self,
        forward: ForwardFn,
        max_batch_size: int,
        max_blocks_per_seq: int,
        block_size: int,
        device: torch.device,
        prefill_max_tokens: int = 0,
        stage_input: tuple[int, torch.dtype] | None = None,
    ) -> None:
        self.forward = forward
        # (hidden size, dtype) of what a pipeline stage after the first receives; None.
        self.stage_input = stage_input
        self.batch_sizes = graph_batch_sizes(max_batch_size)
        # Steps with prompt tokens of up to prefill_max_tokens (the step budget) and up to the
        # decode batch's requests beside them; 0: none.
        self.prefill = (
            PrefillGraphs(
                forward,
                max_blocks_per_seq,
                block_size,
                device,
                prefill_max_tokens,
                request_buckets=request_buckets_for(max_batch_size),
            )
            if prefill_max_tokens > 0
            else None
        )
        self.max_blocks_per_seq = max_blocks_per_seq
        self.block_size = block_size
        self.device = device
        self.capture_times = CaptureTimes()
        self.static: _StaticInputs | None = None  # allocated at capture
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self.pool_bytes = 0
        self.capture_seconds = 0.0

    def _allocate_static(self) -> _StaticInputs:
        device, max_blocks_per_seq = self.device, self.max_blocks_per_seq
        max_bs = self.batch_sizes[-1]
        zeros = dict(device=device)
        words = torch.from_numpy(
            pack_decode_words(max_bs, *(np.zeros(0, dtype=np.int64),) * 3)
        ).to(device)
        views = {
            name: words[start : start + count]
            for name, (start, count) in decode_words_layout(max_bs).items()
        }
        stage_input = None
        if self.stage_input is not None:
            hidden_size, dtype = self.stage_input
            stage_input = tuple(
                torch.zeros((max_bs, hidden_size), dtype=dtype, **zeros) for _ in range(2)
            )
        return _StaticInputs(
            stage_input=stage_input,
            input_ids=torch.zeros(max_bs, dtype=torch.int32, **zeros),
            positions=views["positions"].view(torch.long),
            slot_mapping=views["slot_mapping"].view(torch.long),
            query_start_loc=torch.arange(max_bs + 1, dtype=torch.int32, device=device),
            seq_lens=views["seq_lens"],
            block_tables=torch.zeros((max_bs, max_blocks_per_seq), dtype=torch.int32, **zeros),
            words=words,
        )

    def _metadata(self, batch_size: int) -> AttentionMetadata:
        static = self.static
        assert static is not None
        return AttentionMetadata(
            slot_mapping=static.slot_mapping[:batch_size],
            query_start_loc=static.query_start_loc[: batch_size + 1],
            seq_lens=static.seq_lens[:batch_size],
            block_tables=static.block_tables[:batch_size],
            max_query_len=1,
            max_seq_len=self.max_blocks_per_seq * self.block_size,
            block_size=self.block_size,
            query_start_loc_host=list(range(batch_size + 1)),
            seq_lens_host=[1] * batch_size,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every bucket, largest first, into one pool; record the pool's size."""
        started = time.perf_counter()
        torch.cuda.synchronize(self.device)
        # Capture empties the allocator's cache on entry; empty it first, so the difference
        # in reserved memory is the pool and nothing else.
        torch.cuda.empty_cache()
        reserved_before = torch.cuda.memory_reserved(self.device)
        pool = torch.cuda.graph_pool_handle()
        self.static = self._allocate_static()
        times = self.capture_times = CaptureTimes()
        if self.prefill is not None:
            self.prefill.capture(pool, times)  # their activations are the largest: first
        static = self.static
        for index, batch_size in enumerate(reversed(self.batch_sizes)):
            metadata = self._metadata(batch_size)
            ids, positions = static.input_ids[:batch_size], static.positions[:batch_size]
            run = functools.partial(self.forward, ids, positions, metadata)
            if static.stage_input is not None:
                hidden, residual = static.stage_input
                run = functools.partial(run, (hidden[:batch_size], residual[:batch_size]))
            graph, output = capture_graph(
                run,
                pool,
                self.device,
                times,
                run_eagerly_first=index == 0,
            )
            self._graphs[batch_size] = graph
            self._outputs[batch_size] = output
        torch.cuda.synchronize(self.device)
        self.pool_bytes = max(0, torch.cuda.memory_reserved(self.device) - reserved_before)
        self.capture_seconds = time.perf_counter() - started

    @property
    def num_prefill_graphs(self) -> int:
        return len(self.prefill.buckets) if self.prefill is not None else 0

    def _is_decode_step(
        self, num_reqs: int, num_tokens: int, max_query_len: int, width: int
    ) -> bool:
        return (
            max_query_len == 1
            and num_tokens == num_reqs
            and num_reqs <= self.batch_sizes[-1]
            and width <= self.max_blocks_per_seq
        )

    @property
    def captured(self) -> bool:
        return bool(self._graphs)

    def can_run(self, num_reqs: int, num_tokens: int, max_query_len: int, width: int) -> bool:
        """A decode-only step (one token a request) that fits a captured bucket, or a small
        step with prompt tokens that fits a prefill bucket."""
        if not self.captured:
            return False
        if self._is_decode_step(num_reqs, num_tokens, max_query_len, width):
            return True
        return (
            self.prefill is not None
            and self.prefill.bucket_for(num_reqs, num_tokens, width) is not None
        )

    def decode_batch_size(
        self, num_reqs: int, num_tokens: int, max_query_len: int, width: int
    ) -> int | None:
        """The bucket a captured decode graph replays this step at, or None (not a decode
        step, no bucket holds it, or nothing captured): the step's builder then writes the
        graph's inputs straight into its static buffers (StepInputBuilder)."""
        if not self.captured or not self._is_decode_step(
            num_reqs, num_tokens, max_query_len, width
        ):
            return None
        return padded_batch_size(num_reqs, self.batch_sizes)

    def stage_input_buffers(self, num_reqs: int) -> list[torch.Tensor]:
        """Where a pipeline stage after the first receives a decode step's hidden states and
        residual before run() replays it (the rows of its requests; padding rows keep stale
        values, whose outputs nothing reads)."""
        static = self.static
        assert static is not None and static.stage_input is not None
        return [buffer[:num_reqs] for buffer in static.stage_input]

    def eager_metadata(self, metadata: AttentionMetadata, num_tokens: int) -> AttentionMetadata:
        """metadata marked with the launches that this step's graph bucket takes (if it fits
        one): the eager run of a step then gives the same numbers as its graph's replay, so
        turning graphs off (or a step that misses a graph) never changes results."""
        num_reqs, width = metadata.num_reqs, metadata.block_tables.shape[1]
        if self._is_decode_step(num_reqs, num_tokens, metadata.max_query_len, width):
            padded = padded_batch_size(num_reqs, self.batch_sizes)
            return dataclasses.replace(metadata, launch_num_reqs=padded)
        bucket = self.prefill.bucket_for(num_reqs, num_tokens, width) if self.prefill else None
        if bucket is not None:
            padded_tokens, padded_reqs = bucket
            return dataclasses.replace(
                metadata,
                graph_launches=True,
                launch_num_tokens=padded_tokens,
                launch_num_reqs=padded_reqs,
            )
        return metadata

    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        inputs_written: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Replay the bucket that holds this step (can_run said one does); returns
        [num_tokens, hidden] states (a view into the graph's output, valid until the next
        replay; a pipeline stage before the last: its (hidden states, residual), alike).
        inputs_written: a decode step whose builder already wrote the positions, cache slots,
        context lengths (padding rows included) and block-table rows into the static buffers
        (StepInputBuilder); only the input ids are copied then."""
        num_reqs = metadata.num_reqs
        num_tokens = input_ids.shape[0]
        width = metadata.block_tables.shape[1]
        if not self._is_decode_step(num_reqs, num_tokens, metadata.max_query_len, width):
            assert self.prefill is not None
            bucket = self.prefill.bucket_for(num_reqs, num_tokens, width)
            assert bucket is not None
            return self.prefill.run(bucket, input_ids, positions, metadata)
        batch_size = padded_batch_size(num_reqs, self.batch_sizes)
        assert batch_size is not None
        static = self.static
        assert static is not None, "run before capture"
        static.input_ids[:num_reqs].copy_(input_ids, non_blocking=True)
        if not inputs_written:
            static.positions[:num_reqs].copy_(positions, non_blocking=True)
            static.slot_mapping[:num_reqs].copy_(metadata.slot_mapping, non_blocking=True)
            static.seq_lens[:num_reqs].copy_(metadata.seq_lens, non_blocking=True)
            static.block_tables[:num_reqs, :width].copy_(metadata.block_tables, non_blocking=True)
        if batch_size > num_reqs:
            # Padding requests: one token at slot 0 of the null block, a context of one (the
            # builder's words hold the first two already).
            if not inputs_written:
                static.slot_mapping[num_reqs:batch_size].zero_()
                static.seq_lens[num_reqs:batch_size].fill_(1)
            static.block_tables[num_reqs:batch_size, 0].zero_()
        self._graphs[batch_size].replay()
        output = self._outputs[batch_size]
        if isinstance(output, tuple):
            return tuple(part[:num_reqs] for part in output)
        return output[:num_reqs]
