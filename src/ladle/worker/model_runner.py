"""The model runner: scheduler output -> device tensors -> model -> sampler -> token ids.

It owns the weights, the KV cache tensors and the sampler. Per step: one host-to-device copy of
the packed step metadata (step_inputs.py), one forward over the flattened batch, logits only for
the rows that sample, and one device-to-host copy of the sampled ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ladle.attention.backend import get_attention_backend
from ladle.config import EngineConfig, resolve_device, resolve_dtype
from ladle.core.request import Request
from ladle.core.scheduler import SchedulerOutput
from ladle.engine.messages import TokenLogprobs
from ladle.model.loader import load_model
from ladle.model.loader.errors import ModelLoadError
from ladle.sample.logprobs import logprobs_to_messages
from ladle.sample.metadata import build_sampling_metadata, build_sampling_rows
from ladle.sample.sampler import Sampler
from ladle.structured.manager import GrammarBitmask
from ladle.worker.cuda_graphs import DecodeGraphs
from ladle.worker.dummy_batch import build_dummy_step
from ladle.worker.kv_cache_alloc import zeros_lazily
from ladle.worker.memory import module_bytes, size_kv_cache
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
        # Decode steps replay CUDA graphs unless the user asked for eager mode (CUDA only).
        self.uses_graphs = self.device.type == "cuda" and not config.model.enforce_eager
        self.kv_caches: list[torch.Tensor] = []
        self.graphs: DecodeGraphs | None = None  # captured once the KV cache exists
        self.memory_budget = size_kv_cache(
            config.cache,
            self.arch,
            self.dtype,
            self.device,
            weights_bytes=module_bytes(self.model),
            run_peak_forward=self._run_peak_forward,
            run_graph_probe=self._run_graph_probe if self.uses_graphs else None,
        )
        self.kv_caches = self._allocate_kv_caches(self.memory_budget.num_blocks)
        if self.uses_graphs:
            self.graphs = self._capture_graphs()
            self.memory_budget = dataclasses.replace(
                self.memory_budget, graph_pool_bytes=self.graphs.pool_bytes
            )

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

    def _allocate_kv_caches(self, num_blocks: int) -> list[torch.Tensor]:
        shape = (2, num_blocks, self.block_size, self.arch.num_key_value_heads, self.arch.head_dim)
        return [
            zeros_lazily(shape, self.dtype, self.device)
            for _ in range(self.arch.num_hidden_layers)
        ]

    @torch.inference_mode()
    def _run_probe_step(self, num_tokens: int, num_reqs: int) -> None:
        """One step of made-up requests through the real step path (execute), every write going
        to the null block of a one-block cache: what a real step of that size allocates."""
        step, block_ids = build_dummy_step(num_tokens, num_reqs, self.block_size)
        real_caches, self.kv_caches = self.kv_caches, self._allocate_kv_caches(1)
        try:
            self.execute(step, block_ids)
        finally:
            self.kv_caches = real_caches

    def _run_peak_forward(self) -> None:
        """The worst-case step for memory: a full token budget of prompt tokens, as many rows
        sampling as may, every sampling feature on."""
        scheduler_config = self.config.scheduler
        num_tokens = min(scheduler_config.max_num_batched_tokens, self.max_model_len)
        self._run_probe_step(num_tokens, scheduler_config.max_num_seqs)

    def _run_graph_probe(self) -> None:
        """A decode step of the largest graph bucket: about what the graph pool will hold."""
        batch_size = self._graph_max_batch_size()
        self._run_probe_step(batch_size, batch_size)

    def _graph_max_batch_size(self) -> int:
        return min(self.config.scheduler.max_num_seqs, MAX_GRAPH_BATCH_SIZE)

    def _capture_graphs(self) -> DecodeGraphs:
        def forward(input_ids, positions, metadata):
            return self.model(input_ids, positions, self.kv_caches, metadata)

        graphs = DecodeGraphs(
            forward,
            max_batch_size=self._graph_max_batch_size(),
            max_blocks_per_seq=-(-self.max_model_len // self.block_size),
            block_size=self.block_size,
            device=self.device,
        )
        graphs.capture()
        return graphs

    @torch.inference_mode()
    def execute(
        self,
        scheduler_output: SchedulerOutput,
        block_ids: list[list[int]],
        fill_grammar_bitmask: Callable[[list[Request]], GrammarBitmask | None] | None = None,
    ) -> RunnerOutput:
        """fill_grammar_bitmask: the constrained rows' masks for the sampling requests; called
        once the forward pass is launched, so the CPU fills them while the device computes."""
        requests = scheduler_output.scheduled_requests
        sampling_positions = [
            index for index, request in enumerate(requests) if scheduler_output.will_sample(request)
        ]
        sampling_requests = [requests[index] for index in sampling_positions]
        rows_host = build_sampling_rows(
            [r.sampling_params for r in sampling_requests],
            [r.sampling_seed for r in sampling_requests],
            [r.num_output_tokens for r in sampling_requests],
        )
        inputs = self.input_builder.build(
            scheduler_output, block_ids, rows_host, sampling_positions
        )
        attn_metadata = inputs.attn_metadata
        if self.graphs is not None and self.graphs.can_run(
            attn_metadata.num_reqs,
            inputs.input_ids.shape[0],
            attn_metadata.max_query_len,
            attn_metadata.block_tables.shape[1],
        ):
            hidden = self.graphs.run(inputs.input_ids, inputs.positions, attn_metadata)
        else:
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, attn_metadata)
        sampled_ids = [-1] * len(requests)
        prompt_logprobs = None
        if any(r.sampling_params.prompt_logprobs is not None for r in requests):
            prompt_logprobs = compute_prompt_logprobs(
                self.model.compute_logits, hidden, scheduler_output
            )
        if not sampling_requests:
            return RunnerOutput(
                sampled_token_ids=sampled_ids, logprobs=None, prompt_logprobs=prompt_logprobs
            )
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        grammar_bitmask = fill_grammar_bitmask(sampling_requests) if fill_grammar_bitmask else None
        # Penalty and min_tokens token ids are read (and copied) only in batches that use them.
        metadata = build_sampling_metadata(
            [r.sampling_params for r in sampling_requests],
            [r.sampling_seed for r in sampling_requests],
            [r.num_output_tokens for r in sampling_requests],
            vocab_size=logits.shape[-1],
            prompt_token_ids=[r.prompt_token_ids for r in sampling_requests],
            output_token_ids=[r.output_token_ids for r in sampling_requests],
            eos_token_ids=[r.eos_token_ids for r in sampling_requests],
            device=self.device,
            rows=inputs.sampling_rows,
        )
        sampler_output = self.sampler(logits, metadata, grammar_bitmask)
        # The one device-to-host copy of the step (plus logprobs, only when some row asked).
        token_ids = sampler_output.sampled_token_ids.tolist()
        for position, token_id in zip(sampling_positions, token_ids):
            sampled_ids[position] = token_id
        logprobs = None
        if metadata.flags.max_num_logprobs is not None:
            per_request = logprobs_to_messages(
                sampler_output, [r.sampling_params.logprobs for r in sampling_requests]
            )
            logprobs = [None] * len(requests)
            for position, entry in zip(sampling_positions, per_request):
                logprobs[position] = entry
        return RunnerOutput(
            sampled_token_ids=sampled_ids, logprobs=logprobs, prompt_logprobs=prompt_logprobs
        )
