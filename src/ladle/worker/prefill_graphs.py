"""CUDA graphs of small steps with prompt tokens: a few requests, up to a few thousand tokens.

A step with prompt tokens runs the model eagerly: about 700 launches for a 28-layer model, each
costing the host 10-50 us (Triton's launch path is the dearest). For a short prompt the host's
launches take far longer than the GPU's work (W3, 512 prompt tokens on the 0.6B shape: ~30 ms
of launches against ~3 ms of kernels), so the time to first token was the host's. These graphs
replay such a step with one launch.

- Buckets: a token count from PREFILL_TOKEN_BUCKETS times a request count from
  PREFILL_REQUEST_BUCKETS. A step is padded with at least one padding request; the padding
  requests share the bucket's remaining tokens evenly. Padding tokens write
  their keys and values to slot 0 of the null block (which no real request reads) and attend
  over whatever their block table row holds; their outputs are never read.
- The attention kernel's prefill launch is general (any mix of query lengths and cached
  context, kernels/paged_attention.py): its grid depends only on the padded token and request
  counts, so one captured graph is right for any real layout that fits its bucket. Decodes in
  such a step ride the same launch, also when the step runs eagerly (graph_launches in its
  metadata), so a graph never changes a step's numbers; larger eager steps give leading
  decodes their own launch.
- Mixed steps (many decodes beside one prompt's chunk) are the common step of a busy server:
  one arrival among 32 or 256 running requests. Eagerly such a step costs the host ~30-50 ms of
  launches for a few ms of GPU work, stalling every running stream; so the request buckets go
  up to the largest decode batch (request_buckets_for).
- Token buckets go up to the step budget, but not past the step size at which the GPU's work
  outlasts an eager step's launches (graph_worthy_tokens): there a graph saves nothing and costs
  capture time at start-up and pool memory. On the 0.6B shape that is past the budget: a busy
  server's step of ~128 decodes beside two arrivals' prompts (~2,000-2,500 tokens) replays a
  graph instead of ~30 ms of launches. On the 8B shape it is ~1,000 tokens.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ladle.attention.metadata import AttentionMetadata
from ladle.worker.graph_capture import CaptureTimes, capture_graph

PREFILL_TOKEN_BUCKETS = (
    16, 32, 64, 128, 256, 384, 512, 640, 768, 896, 1024, 1536, 2048, 3072, 4096, 8192
)
PREFILL_REQUEST_BUCKETS = (2, 4, 8)

# What an eager step costs the host per decoder layer on an H100 machine: ~13 launches with the
# fused kernels, 0.6-1.3 ms measured (docs/benchmarks.md, the fused-kernel table).
EAGER_HOST_S_PER_LAYER = 0.8e-3
# The bf16 matmul rate a prefill step's GEMMs reach on Hopper (the bench measures ~785 TFLOP/s
# for large square GEMMs; a step's narrower ones get less).
PREFILL_MATMUL_FLOPS_PER_S = 6e14


def graph_worthy_tokens(num_layers: int, layer_params: int) -> int:
    """The step size (tokens) at which the GPU's work, 2 FLOPs per decoder-layer weight per
    token, takes as long as an eager step's launches: larger steps gain nothing from a graph.
    A deterministic estimate from the model's shape (not a timing), so that one configuration
    always captures the same graphs and steps take the same launches run after run."""
    host_s = num_layers * EAGER_HOST_S_PER_LAYER
    return int(host_s * PREFILL_MATMUL_FLOPS_PER_S / (2 * max(layer_params, 1)))


def request_buckets_for(max_requests: int) -> tuple[int, ...]:
    """Powers of two from 2 up to the first that holds max_requests plus a padding request."""
    buckets = [2]
    while buckets[-1] <= max_requests:
        buckets.append(buckets[-1] * 2)
    return tuple(buckets)


ForwardFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


def prefill_bucket(
    num_tokens: int,
    num_reqs: int,
    token_buckets: tuple[int, ...] = PREFILL_TOKEN_BUCKETS,
    request_buckets: tuple[int, ...] = PREFILL_REQUEST_BUCKETS,
) -> tuple[int, int] | None:
    """(tokens, requests) of the smallest bucket that holds the step plus at least one padding
    request of at least one token per padding request; None when no bucket does."""
    padded_reqs = next((size for size in request_buckets if size > num_reqs), None)
    if padded_reqs is None:
        return None
    # Buckets are captured with room for real tokens beside the padding (tokens >= 2 * reqs).
    needed = max(num_tokens + padded_reqs - num_reqs, 2 * padded_reqs)
    padded_tokens = next((size for size in token_buckets if size >= needed), None)
    if padded_tokens is None:
        return None
    return padded_tokens, padded_reqs


def largest_prefill_bucket(
    max_num_tokens: int, request_buckets: tuple[int, ...] = PREFILL_REQUEST_BUCKETS
) -> tuple[int, int] | None:
    """(tokens, requests) of the largest bucket within a step budget of max_num_tokens."""
    tokens = [size for size in PREFILL_TOKEN_BUCKETS if size <= max_num_tokens]
    if not tokens:
        return None
    return tokens[-1], max(r for r in request_buckets if tokens[-1] >= 2 * r)


@dataclass
class _StaticInputs:
    input_ids: torch.Tensor  # [max_tokens] int32
    positions: torch.Tensor  # [max_tokens] int64
    slot_mapping: torch.Tensor  # [max_tokens] int64
    query_start_loc: torch.Tensor  # [max_reqs + 1] int32
    seq_lens: torch.Tensor  # [max_reqs] int32
    block_tables: torch.Tensor  # [max_reqs, max_blocks_per_seq] int32
    ramp: torch.Tensor  # [max_reqs + 1] int32: 0, 1, 2, ... (padding query offsets)


class PrefillGraphs:
    """The captured small-prefill graphs of one model runner and the buffers they read."""

    def __init__(
        self,
        forward: ForwardFn,
        max_blocks_per_seq: int,
        block_size: int,
        device: torch.device,
        max_num_tokens: int,
        token_buckets: tuple[int, ...] = PREFILL_TOKEN_BUCKETS,
        request_buckets: tuple[int, ...] = PREFILL_REQUEST_BUCKETS,
    ) -> None:
        self.forward = forward
        # A bucket above the step's token budget would never be used, and the padding request
        # (whose context is its own tokens) must fit a block-table row.
        limit = min(max_num_tokens, max_blocks_per_seq * block_size)
        self.token_buckets = tuple(t for t in token_buckets if t <= limit)
        self.request_buckets = tuple(request_buckets)
        self.buckets = [
            (tokens, reqs)
            for tokens in self.token_buckets
            for reqs in self.request_buckets
            if tokens >= 2 * reqs  # room for real tokens beside one token per padding request
        ]
        self._bucket_set = set(self.buckets)
        self.max_blocks_per_seq = max_blocks_per_seq
        self.block_size = block_size
        self.device = device
        self.static: _StaticInputs | None = None  # allocated at capture
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self._outputs: dict[tuple[int, int], torch.Tensor] = {}

    def _allocate_static(self) -> _StaticInputs:
        device, max_blocks_per_seq = self.device, self.max_blocks_per_seq
        max_tokens = max(self.token_buckets, default=0)
        max_reqs = max(self.request_buckets)
        return _StaticInputs(
            input_ids=torch.zeros(max_tokens, dtype=torch.int32, device=device),
            positions=torch.zeros(max_tokens, dtype=torch.long, device=device),
            slot_mapping=torch.zeros(max_tokens, dtype=torch.long, device=device),
            query_start_loc=torch.zeros(max_reqs + 1, dtype=torch.int32, device=device),
            seq_lens=torch.ones(max_reqs, dtype=torch.int32, device=device),
            block_tables=torch.zeros(
                (max_reqs, max_blocks_per_seq), dtype=torch.int32, device=device
            ),
            ramp=torch.arange(max_reqs + 1, dtype=torch.int32, device=device),
        )

    def _capture_metadata(self, num_tokens: int, num_reqs: int) -> AttentionMetadata:
        """The layout captured: request 0 holds all but num_reqs - 1 tokens, the others one
        each (so no request leads as a decode and the step takes the one general launch)."""
        first = num_tokens - (num_reqs - 1)
        starts = [0] + [first + index for index in range(num_reqs)]
        lengths = [first] + [1] * (num_reqs - 1)
        static = self.static
        assert static is not None
        static.query_start_loc[: num_reqs + 1].copy_(torch.tensor(starts, dtype=torch.int32))
        static.seq_lens[:num_reqs].copy_(torch.tensor(lengths, dtype=torch.int32))
        return AttentionMetadata(
            slot_mapping=static.slot_mapping[:num_tokens],
            query_start_loc=static.query_start_loc[: num_reqs + 1],
            seq_lens=static.seq_lens[:num_reqs],
            block_tables=static.block_tables[:num_reqs],
            max_query_len=first,
            max_seq_len=self.max_blocks_per_seq * self.block_size,
            block_size=self.block_size,
            query_start_loc_host=starts,
            seq_lens_host=lengths,
            graph_launches=True,
            launch_num_tokens=num_tokens,
            launch_num_reqs=num_reqs,
        )

    @torch.inference_mode()
    def capture(self, pool, times: CaptureTimes) -> None:
        """Capture every bucket, largest first, into pool (shared with the decode graphs)."""
        static = self.static = self._allocate_static()
        if self.device.type == "cuda" and self.buckets:
            self._build_input_kernel()
        for index, bucket in enumerate(sorted(self.buckets, reverse=True)):
            num_tokens, num_reqs = bucket
            metadata = self._capture_metadata(num_tokens, num_reqs)
            ids, positions = static.input_ids[:num_tokens], static.positions[:num_tokens]
            graph, output = capture_graph(
                functools.partial(self.forward, ids, positions, metadata),
                pool,
                self.device,
                times,
                run_eagerly_first=index == 0,
            )
            self._graphs[bucket] = graph
            self._outputs[bucket] = output

    def _build_input_kernel(self) -> None:
        """Build the input-filling kernel's variants now, not under a user: a step's input ids
        are int32 when the host wrote them and int64 when read from the device (the sampled
        ids), and each dtype is a variant of its own. One request of one token into the
        smallest bucket (the capture writes the buffers next anyway); the other inputs have
        the dtypes a step's builder ships (worker/step_inputs.py)."""
        from ladle.kernels.prefill_graph_inputs import fill_prefill_inputs

        static, device = self.static, self.device
        assert static is not None
        zeros = functools.partial(torch.zeros, device=device)
        starts = torch.tensor([0, 1], dtype=torch.int32, device=device)
        lengths = torch.ones(1, dtype=torch.int32, device=device)
        table = zeros((1, 1), dtype=torch.int32)
        for ids_dtype in (torch.int32, torch.int64):
            fill_prefill_inputs(
                static.input_ids, static.positions, static.slot_mapping, static.query_start_loc,
                static.seq_lens, static.block_tables, zeros(1, dtype=ids_dtype),
                zeros(1, dtype=torch.int64), zeros(1, dtype=torch.int64), starts, lengths, table,
                *min(self.buckets),
            )  # fmt: skip

    def bucket_for(self, num_reqs: int, num_tokens: int, width: int) -> tuple[int, int] | None:
        """The bucket that holds this step, or None (then it runs eagerly: no graph, no graph
        launches). Shapes only: whether the graphs were captured is the caller's question."""
        if width > self.max_blocks_per_seq:
            return None
        bucket = prefill_bucket(num_tokens, num_reqs, self.token_buckets, self.request_buckets)
        return bucket if bucket in self._bucket_set else None

    def run(
        self,
        bucket: tuple[int, int],
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Replay bucket (from bucket_for) for this step; returns [num_tokens, hidden] states
        (a view into the graph's output, valid until the next replay)."""
        static = self.static
        assert static is not None, "run before capture"
        if self.device.type == "cuda":
            # One launch instead of fill_inputs_with_torch's 14 (kernels/prefill_graph_inputs.py).
            from ladle.kernels.prefill_graph_inputs import fill_prefill_inputs

            padded_tokens, padded_reqs = bucket
            fill_prefill_inputs(
                static.input_ids,
                static.positions,
                static.slot_mapping,
                static.query_start_loc,
                static.seq_lens,
                static.block_tables,
                input_ids,
                positions,
                metadata.slot_mapping,
                metadata.query_start_loc,
                metadata.seq_lens,
                metadata.block_tables,
                padded_tokens,
                padded_reqs,
            )
        else:
            self.fill_inputs_with_torch(bucket, input_ids, positions, metadata)
        self._graphs[bucket].replay()
        return self._outputs[bucket][: input_ids.shape[0]]

    def fill_inputs_with_torch(
        self,
        bucket: tuple[int, int],
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> None:
        """The step's inputs and the bucket's padding into the static buffers, in torch calls
        (the CPU's path, and the reference of kernels/prefill_graph_inputs.py)."""
        padded_tokens, padded_reqs = bucket
        num_tokens = input_ids.shape[0]
        num_reqs = metadata.num_reqs
        num_pads = padded_reqs - num_reqs
        static = self.static
        assert static is not None, "run before capture"
        static.input_ids[:num_tokens].copy_(input_ids, non_blocking=True)
        static.positions[:num_tokens].copy_(positions, non_blocking=True)
        static.slot_mapping[:num_tokens].copy_(metadata.slot_mapping, non_blocking=True)
        static.input_ids[num_tokens:padded_tokens].zero_()
        static.positions[num_tokens:padded_tokens].zero_()
        static.slot_mapping[num_tokens:padded_tokens].zero_()
        static.query_start_loc[: num_reqs + 1].copy_(metadata.query_start_loc, non_blocking=True)
        static.seq_lens[:num_reqs].copy_(metadata.seq_lens, non_blocking=True)
        width = metadata.block_tables.shape[1]
        static.block_tables[:num_reqs, :width].copy_(metadata.block_tables, non_blocking=True)
        # Padding requests share the padding tokens evenly, each a context of its own tokens:
        # one holding them all would attend over them quadratically, which in a large bucket
        # (thousands of padding tokens) costs more than the step's real work. Request j starts
        # at num_tokens + j * base + min(j, extra), written by device ops (no host copy).
        base, extra = divmod(padded_tokens - num_tokens, num_pads)
        ramp = static.ramp[: num_pads + 1]
        starts = static.query_start_loc[num_reqs : padded_reqs + 1]
        torch.clamp(ramp, max=extra, out=starts)
        torch.add(starts, ramp, alpha=base, out=starts)
        starts.add_(num_tokens)
        torch.sub(starts[1:], starts[:-1], out=static.seq_lens[num_reqs:padded_reqs])
        static.block_tables[num_reqs:padded_reqs].zero_()
