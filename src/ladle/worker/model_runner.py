"""The model runner: scheduler output -> device tensors -> model -> sampler -> token ids.

It owns the weights, the KV cache tensors and the sampler. Per step: one host-to-device copy of
the packed step metadata (step_inputs.py), one forward over the flattened batch, logits only for
the rows that sample, and one device-to-host copy of the sampled ids.

execute() only launches the step: it returns a LaunchedStep whose result() waits for the sampled
ids, so the engine can schedule and launch the next step first (overlapped scheduling). Each
request holds a slot of the persistent batch while it lives; the sampled ids are also written to
their slots on the device, where the next step reads a decode row's input id before the host has
seen it (release() frees the slots of requests that ended or were preempted).

execute() is launch_forward() then sample(): the engine calls the two apart when a row's sampling
needs the previous step's tokens on the host (a grammar, bad_words), so that step is read while
the device runs this one's forward pass. Penalty rows need no host tokens: their token ids live on
the device (penalty_history.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ladle.attention.backend import get_attention_backend
from ladle.attention.kv_quant import FP8_KV_DTYPE, resolve_kv_cache_dtype
from ladle.config import EngineConfig, resolve_device, resolve_dtype
from ladle.core.request import Request
from ladle.core.scheduler import SchedulerOutput
from ladle.engine.messages import TokenLogprobs
from ladle.kernels.parallel_builds import builds_only
from ladle.model.loader import load_model
from ladle.model.loader.errors import ModelLoadError
from ladle.sample.logprobs import logprobs_to_messages
from ladle.sample.metadata import SamplingFlags, build_sampling_metadata
from ladle.sample.output import SamplerOutput
from ladle.sample.sampler import Sampler
from ladle.structured.manager import PendingGrammarBitmask
from ladle.worker import kv_calibration
from ladle.worker.cuda_graphs import DecodeGraphs
from ladle.worker.dummy_batch import build_dummy_step
from ladle.worker.forward_step import ForwardStep
from ladle.worker.kv_cache_alloc import zeros_lazily
from ladle.worker.memory import module_bytes, size_kv_cache
from ladle.worker.penalty_history import PenaltyHistory
from ladle.worker.persistent_batch import BlockUpdate, PersistentBatch
from ladle.worker.prefill_graphs import (
    graph_worthy_tokens,
    largest_prefill_bucket,
    request_buckets_for,
)
from ladle.worker.prompt_logprobs import PromptLogprobsChunk, compute_prompt_logprobs
from ladle.worker.step_inputs import StepInputBuilder

# Decode batches above this run eagerly: past it, one step's kernels outlast their launches.
MAX_GRAPH_BATCH_SIZE = 512


@dataclass
class RunnerOutput:
    # One entry per scheduled request, in batch order; -1 where the request did not sample.
    sampled_token_ids: list[int]
    logprobs: list[TokenLogprobs | None] | None
    # request id -> this step's prompt logprobs, for requests that asked (prompt_logprobs.py)
    prompt_logprobs: dict[str, PromptLogprobsChunk] | None = None


@dataclass
class LaunchedStep:
    """A step queued on the device: its sampled ids (and logprobs) are being copied to pinned
    host memory; result() waits for that copy alone."""

    num_requests: int
    sampling_positions: list[int]
    sampled_host: torch.Tensor | None  # [num_sampling] int64; None when no request sampled
    logprobs_host: SamplerOutput | None  # host copies, when some request asked for logprobs
    num_logprobs_per_req: list[int | None]
    copied: torch.cuda.Event | None  # None on the CPU (the tensors are final already)
    prompt_logprobs: dict[str, PromptLogprobsChunk] | None = None

    def result(self) -> RunnerOutput:
        sampled_ids = [-1] * self.num_requests
        if self.sampled_host is None:
            return RunnerOutput(
                sampled_token_ids=sampled_ids, logprobs=None, prompt_logprobs=self.prompt_logprobs
            )
        if self.copied is not None:
            self.copied.synchronize()
        for position, token_id in zip(self.sampling_positions, self.sampled_host.tolist()):
            sampled_ids[position] = token_id
        logprobs = None
        if self.logprobs_host is not None:
            per_request = logprobs_to_messages(self.logprobs_host, self.num_logprobs_per_req)
            logprobs = [None] * self.num_requests
            for position, entry in zip(self.sampling_positions, per_request):
                logprobs[position] = entry
        return RunnerOutput(
            sampled_token_ids=sampled_ids, logprobs=logprobs, prompt_logprobs=self.prompt_logprobs
        )


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A non-blocking copy into pinned host memory (the tensor itself on the CPU)."""
    if tensor.device.type == "cpu":
        return tensor
    host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
    return host.copy_(tensor, non_blocking=True)


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = resolve_device(config.model.device)
        self.dtype = resolve_dtype(config.model.dtype, self.device)
        self.block_size = config.cache.block_size
        torch.manual_seed(config.model.seed)
        self.attention_backend = get_attention_backend(self.device)
        loaded = load_model(config.model, self.device, self.dtype, self.attention_backend)
        self.model = loaded.model
        self.arch = loaded.arch_config
        self.model_path = loaded.model_path
        self.load_source = loaded.source
        self.max_model_len = self._resolve_max_model_len()
        self.sampler = Sampler()
        self.input_builder = StepInputBuilder(self.device, self.block_size)
        self.batch = PersistentBatch(
            max_blocks_per_seq=self._max_blocks_per_seq(),
            device=self.device,
            initial_slots=config.scheduler.max_num_seqs + 8,
        )
        # Steps replayed from a CUDA graph and steps run eagerly (/metrics): an eager step of a
        # small model costs the host tens of ms of launches while every stream waits.
        self.num_graph_steps = 0
        self.num_eager_steps = 0
        # Decode steps replay CUDA graphs unless the user asked for eager mode (CUDA only).
        self.uses_graphs = self.device.type == "cuda" and not config.model.enforce_eager
        # Penalty requests' token ids on the device, made at the first step that samples.
        self.penalty_history: PenaltyHistory | None = None
        self.kv_caches: list[torch.Tensor] = []
        # The graphs' buckets (CUDA only), captured once the KV cache exists unless eager.
        self.graph_buckets: DecodeGraphs | None = None
        self.kv_cache_dtype = resolve_kv_cache_dtype(config.cache.kv_cache_dtype, self.dtype)
        if self.kv_cache_dtype == FP8_KV_DTYPE:
            kv_calibration.set_fp8_kv_scales(self)
        if self.device.type == "cuda":
            self._build_kernel_variants()
        self.memory_budget = size_kv_cache(
            config.cache,
            self.arch,
            self.kv_cache_dtype,
            self.device,
            weights_bytes=module_bytes(self.model),
            run_peak_forward=self._run_peak_forward,
            run_graph_probe=self._run_graph_probe if self.uses_graphs else None,
        )
        self.kv_caches = self._allocate_kv_caches(self.memory_budget.num_blocks)
        # On CUDA a step that fits a graph bucket takes its graph's launches even when run
        # eagerly (enforce_eager, or the rare step that misses), so graphs never change results.
        self.graph_buckets = self._graph_buckets() if self.device.type == "cuda" else None
        if self.uses_graphs:
            self.graph_buckets.capture()
            self.memory_budget = dataclasses.replace(
                self.memory_budget, graph_pool_bytes=self.graph_buckets.pool_bytes
            )

    @property
    def graphs(self) -> DecodeGraphs | None:
        """The captured graphs; None in eager mode, on the CPU and before the capture."""
        buckets = self.graph_buckets
        return buckets if buckets is not None and buckets.captured else None

    def _resolve_max_model_len(self) -> int:
        limit = self.arch.max_position_embeddings
        requested = self.config.model.max_model_len
        if requested is None:
            return limit
        if requested > limit:
            raise ModelLoadError(
                f"max_model_len={requested} exceeds the model's max_position_embeddings={limit}"
            )
        return requested

    def _allocate_kv_caches(
        self, num_blocks: int, dtype: torch.dtype | None = None
    ) -> list[torch.Tensor]:
        shape = (2, num_blocks, self.block_size, self.arch.num_key_value_heads, self.arch.head_dim)
        dtype = dtype or self.kv_cache_dtype
        return [zeros_lazily(shape, dtype, self.device) for _ in range(self.arch.num_hidden_layers)]

    @torch.inference_mode()
    def _run_probe_step(self, num_tokens: int, num_reqs: int, forward_only: bool = False) -> None:
        """One step of made-up requests through the real step path (execute), every write going
        to the null block of a one-block cache: what a real step of that size allocates.
        forward_only: launch the forward and logits, not the sampler."""
        step, block_ids = build_dummy_step(num_tokens, num_reqs, self.block_size)
        real_caches, self.kv_caches = self.kv_caches, self._allocate_kv_caches(1)
        try:
            updates = [(0, ids) for ids in block_ids]
            if forward_only:
                self.launch_forward(step, updates)
            else:
                self.execute(step, updates).result()
        finally:
            self.kv_caches = real_caches
            self.release([request.request_id for request in step.scheduled_requests])

    def _build_kernel_variants(self) -> None:
        """Build the Triton variants of the forward passes that start-up will run (the memory
        probe's steps, a one-request decode, short prompts) on a thread pool, before any of
        them runs: one dry pass submits every build, then they build side by side instead of
        one at a time on first use (kernels/parallel_builds.py). The sampler's few variants
        still build on first use (its host side reads what its kernels write)."""
        scheduler_config = self.config.scheduler
        peak_tokens = min(scheduler_config.max_num_batched_tokens, self.max_model_len)
        shapes = [(peak_tokens, scheduler_config.max_num_seqs), (1, 1)]
        shapes += [(2**power + 1, 1) for power in range(8) if 2**power + 1 <= peak_tokens]
        if self.uses_graphs:
            batch_size = self._graph_max_batch_size()
            shapes.append((batch_size, batch_size))
            bucket = largest_prefill_bucket(
                self._prefill_graph_max_tokens(), request_buckets_for(batch_size)
            )
            if bucket is not None:
                shapes.append(bucket)
        with builds_only() as active:
            if not active:
                return
            for num_tokens, num_reqs in shapes:
                self._run_probe_step(num_tokens, num_reqs, forward_only=True)
        torch.cuda.synchronize(self.device)

    def _run_peak_forward(self) -> None:
        """The worst-case step for memory: a full token budget of prompt tokens, as many rows
        sampling as may, every sampling feature on."""
        scheduler_config = self.config.scheduler
        num_tokens = min(scheduler_config.max_num_batched_tokens, self.max_model_len)
        self._run_probe_step(num_tokens, scheduler_config.max_num_seqs)

    def _run_graph_probe(self) -> None:
        """A decode step of the largest graph bucket and a step of the largest prefill-graph
        bucket: about what the graph pool will hold."""
        batch_size = self._graph_max_batch_size()
        self._run_probe_step(batch_size, batch_size)
        bucket = largest_prefill_bucket(
            self._prefill_graph_max_tokens(), request_buckets_for(batch_size)
        )
        if bucket is not None:
            self._run_probe_step(*bucket)

    def _prefill_graph_max_tokens(self) -> int:
        """The largest step with prompt tokens worth a graph: within the step budget, and not
        so large that its kernels outlast its eager launches."""
        layer_params = sum(
            p.numel() for name, p in self.model.named_parameters() if "layers." in name
        )
        worthy = graph_worthy_tokens(self.arch.num_hidden_layers, layer_params)
        return min(self.config.scheduler.max_num_batched_tokens, self.max_model_len, worthy)

    def _max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)

    def _graph_max_batch_size(self) -> int:
        return min(self.config.scheduler.max_num_seqs, MAX_GRAPH_BATCH_SIZE)

    def _graph_buckets(self) -> DecodeGraphs:
        """The graphs' buckets, captured only when graphs are on."""

        def forward(input_ids, positions, metadata):
            return self.model(input_ids, positions, self.kv_caches, metadata)

        return DecodeGraphs(
            forward,
            max_batch_size=self._graph_max_batch_size(),
            max_blocks_per_seq=self._max_blocks_per_seq(),
            block_size=self.block_size,
            device=self.device,
            prefill_max_tokens=self._prefill_graph_max_tokens(),
        )

    def release(self, request_ids: list[str]) -> None:
        """Free the persistent-batch slots (and penalty rows) of requests that ended or were
        preempted."""
        self.batch.release(request_ids)
        if self.penalty_history is not None:
            self.penalty_history.release(request_ids)

    # ----- the step ------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(
        self,
        scheduler_output: SchedulerOutput,
        block_updates: list[BlockUpdate],
        fill_grammar_bitmask: Callable[[list[Request]], PendingGrammarBitmask | None] | None = None,
    ) -> LaunchedStep:
        """Launch the step; the LaunchedStep's result() gives the sampled ids.

        block_updates: per scheduled request, the blocks the scheduler added to its table since
        its last step (its whole table when it is new to the batch), or None.

        fill_grammar_bitmask: starts filling the constrained rows' masks for the sampling
        requests on a worker thread; called just before the forward pass is launched (on the CPU
        the forward runs in this thread, so this is the only point that overlaps there), and
        waited for once the logits and the sampling metadata exist."""
        forward = self.launch_forward(scheduler_output, block_updates, fill_grammar_bitmask)
        return self.sample(forward)

    @torch.inference_mode()
    def launch_forward(
        self,
        scheduler_output: SchedulerOutput,
        block_updates: list[BlockUpdate],
        fill_grammar_bitmask: Callable[[list[Request]], PendingGrammarBitmask | None] | None = None,
    ) -> ForwardStep:
        """The first half of execute: inputs, forward pass and logits, queued on the device."""
        requests = scheduler_output.scheduled_requests
        output_index = scheduler_output.output_index
        sampling_positions = [
            index for index, request in enumerate(requests) if request.request_id in output_index
        ]
        sampling_requests = [requests[index] for index in sampling_positions]
        num_output_tokens = [output_index[r.request_id] for r in sampling_requests]
        inputs = self.input_builder.build(
            scheduler_output, block_updates, sampling_positions, num_output_tokens, self.batch
        )
        input_ids = inputs.input_ids
        if inputs.token_slots is not None:
            # Decode rows whose last token the previous step sampled: read it on the device.
            # These ids are int64 (last_sampled's); a graph's int32 buffer converts on its copy.
            from_device = self.batch.last_sampled[inputs.token_slots]
            if inputs.reads_only_device_ids:
                input_ids = from_device
            else:
                input_ids = torch.where(input_ids < 0, from_device, input_ids)
        attn_metadata = inputs.attn_metadata
        pending_bitmask = fill_grammar_bitmask(sampling_requests) if fill_grammar_bitmask else None
        if self.graphs is not None and self.graphs.can_run(
            attn_metadata.num_reqs,
            input_ids.shape[0],
            attn_metadata.max_query_len,
            attn_metadata.block_tables.shape[1],
        ):
            self.num_graph_steps += 1
            hidden = self.graphs.run(input_ids, inputs.positions, attn_metadata)
        else:
            self.num_eager_steps += 1
            if self.graph_buckets is not None:
                attn_metadata = self.graph_buckets.eager_metadata(attn_metadata, input_ids.shape[0])
            hidden = self.model(
                input_ids.to(torch.int32), inputs.positions, self.kv_caches, attn_metadata
            )
        prompt_logprobs = None
        # Only a step with prompt tokens can owe prompt logprobs: decode-only steps skip the scan.
        if scheduler_output.num_prefill_tokens and any(
            r.sampling_params.prompt_logprobs is not None for r in requests
        ):
            # Rare, and read on the host at once: such steps give up their overlap.
            prompt_logprobs = compute_prompt_logprobs(
                self.model.compute_logits, hidden, scheduler_output
            )
        logits = None
        penalty_rows = None
        flags = None
        if sampling_requests:
            if len(sampling_positions) < hidden.shape[0]:
                hidden = hidden[inputs.logits_indices]
            # else every row samples its one token: the rows are hidden's own, in order.
            # In the model's dtype: the sampler widens to float32 only where it must.
            logits = self.model.compute_logits(hidden, float32=False)
            flags = SamplingFlags.from_params([r.sampling_params for r in sampling_requests])
            if not flags.no_penalties:
                # Rows taken now, while every request of the step is live (see ForwardStep).
                penalty_rows = self._penalty_history(logits.shape[-1]).rows_for(
                    sampling_requests, num_output_tokens
                )
        return ForwardStep(
            num_requests=len(requests),
            sampling_positions=sampling_positions,
            sampling_requests=sampling_requests,
            num_output_tokens=num_output_tokens,
            inputs=inputs,
            logits=logits,
            prompt_logprobs=prompt_logprobs,
            pending_bitmask=pending_bitmask,
            penalty_rows=penalty_rows,
            sampling_flags=flags,
        )

    def _penalty_history(self, vocab_size: int) -> PenaltyHistory:
        if self.penalty_history is None:
            self.penalty_history = PenaltyHistory(vocab_size, self.device)
        return self.penalty_history

    @torch.inference_mode()
    def sample(
        self,
        forward: ForwardStep,
        fill_grammar_bitmask: Callable[[list[Request]], PendingGrammarBitmask | None] | None = None,
    ) -> LaunchedStep:
        """The second half of execute: sample the launched forward's logits and start the copy
        of the sampled ids. fill_grammar_bitmask (when the forward started no grammar job) fills
        the masks now, from the matchers as the host has advanced them since the launch."""
        sampling_requests = forward.sampling_requests
        num_logprobs = [r.sampling_params.logprobs for r in sampling_requests]
        if forward.logits is None:
            return LaunchedStep(
                forward.num_requests, [], None, None, num_logprobs, None, forward.prompt_logprobs
            )
        pending_bitmask = forward.pending_bitmask
        if pending_bitmask is None and fill_grammar_bitmask is not None:
            pending_bitmask = fill_grammar_bitmask(sampling_requests)
        logits = forward.logits
        penalty_rows = forward.penalty_rows
        penalty_token_ids = None
        if penalty_rows is not None:
            assert self.penalty_history is not None
            penalty_token_ids = self.penalty_history.token_ids(penalty_rows)
        # bad_words reads the host's output ids: with overlap on, a step with such rows is
        # sampled only once the step before is read (engine/split_launch.py).
        metadata = build_sampling_metadata(
            [r.sampling_params for r in sampling_requests],
            [r.sampling_seed for r in sampling_requests],
            forward.num_output_tokens,
            vocab_size=logits.shape[-1],
            output_token_ids=[r.output_token_ids for r in sampling_requests],
            eos_token_ids=[r.eos_token_ids for r in sampling_requests],
            device=self.device,
            rows=forward.inputs.sampling_rows,
            penalty_token_ids=penalty_token_ids,
            flags=forward.sampling_flags,
        )
        grammar_bitmask = pending_bitmask.wait() if pending_bitmask is not None else None
        sampler_output = self.sampler(logits, metadata, grammar_bitmask)
        sampled = sampler_output.sampled_token_ids
        if penalty_rows is not None:
            assert self.penalty_history is not None
            self.penalty_history.record(penalty_rows, sampled)
        self.batch.last_sampled.index_copy_(0, forward.inputs.sampling_slots, sampled)
        # The one device-to-host copy of the step (plus logprobs, only when some row asked).
        sampled_host = _to_host(sampled)
        logprobs_host = None
        if metadata.flags.max_num_logprobs is not None:
            logprobs_host = SamplerOutput(
                sampled_token_ids=sampled_host,
                logprob_token_ids=_to_host(sampler_output.logprob_token_ids),
                logprobs=_to_host(sampler_output.logprobs),
                sampled_ranks=_to_host(sampler_output.sampled_ranks),
            )
        copied = None
        if self.device.type == "cuda":
            copied = torch.cuda.Event()
            copied.record()
        return LaunchedStep(
            forward.num_requests,
            forward.sampling_positions,
            sampled_host,
            logprobs_host,
            num_logprobs,
            copied,
            forward.prompt_logprobs,
        )
