"""The model runner: scheduler output -> device tensors -> model -> sampler -> token ids.

It owns the weights, the KV cache tensors and the sampler. Per step: one host-to-device copy of
the packed step metadata (step_inputs.py), one forward over the flattened batch, logits only for
the rows that sample, and one device-to-host copy of the sampled ids.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ladle.attention.backend import get_attention_backend
from ladle.attention.metadata import AttentionMetadata
from ladle.config import EngineConfig, resolve_device, resolve_dtype
from ladle.core.request import Request
from ladle.core.scheduler import SchedulerOutput
from ladle.engine.messages import TokenLogprobs
from ladle.model.loader import load_model
from ladle.model.loader.errors import ModelLoadError
from ladle.sample.logprobs import logprobs_to_messages
from ladle.sample.metadata import (
    build_sampling_metadata,
    build_sampling_rows,
)
from ladle.sample.sampler import Sampler
from ladle.sampling_params import MAX_LOGPROBS, SamplingParams
from ladle.structured.manager import GrammarBitmask
from ladle.worker.memory import module_bytes, size_kv_cache
from ladle.worker.step_inputs import StepInputBuilder


@dataclass
class RunnerOutput:
    # One entry per scheduled request, in batch order; -1 where the request did not sample.
    sampled_token_ids: list[int]
    logprobs: list[TokenLogprobs | None] | None


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
        self.memory_budget = size_kv_cache(
            config.cache,
            self.arch,
            self.dtype,
            self.device,
            weights_bytes=module_bytes(self.model),
            run_peak_forward=self._run_peak_forward,
        )
        self.kv_caches = self._allocate_kv_caches(self.memory_budget.num_blocks)

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
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(self.arch.num_hidden_layers)
        ]

    @torch.inference_mode()
    def _run_peak_forward(self) -> None:
        """A worst-case step for memory: a full token budget of prefill plus logits for as many
        rows as can sample. Every token writes into the null block, so a one-block cache will do."""
        scheduler_config = self.config.scheduler
        num_tokens = min(scheduler_config.max_num_batched_tokens, self.max_model_len)
        caches = self._allocate_kv_caches(1)
        metadata = AttentionMetadata(
            slot_mapping=torch.zeros(num_tokens, dtype=torch.long, device=self.device),
            query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32, device=self.device),
            seq_lens=torch.tensor([num_tokens], dtype=torch.int32, device=self.device),
            block_tables=torch.zeros(
                (1, (num_tokens + self.block_size - 1) // self.block_size),
                dtype=torch.int32,
                device=self.device,
            ),
            max_query_len=num_tokens,
            max_seq_len=num_tokens,
            block_size=self.block_size,
            query_start_loc_host=[0, num_tokens],
            seq_lens_host=[num_tokens],
        )
        input_ids = torch.zeros(num_tokens, dtype=torch.long, device=self.device)
        positions = torch.arange(num_tokens, device=self.device)
        hidden = self.model(input_ids, positions, caches, metadata)
        num_rows = min(scheduler_config.max_num_seqs, num_tokens)
        logits = self.model.compute_logits(hidden[:num_rows])
        # The sampler's worst case (sort for top-k/top-p, penalties, logprobs) holds several
        # logits-sized temporaries at once: measure it rather than guess.
        worst_case = SamplingParams(
            temperature=0.8,
            top_k=50,
            top_p=0.9,
            min_p=0.05,
            repetition_penalty=1.1,
            frequency_penalty=0.5,
            logprobs=MAX_LOGPROBS,
        )
        metadata = build_sampling_metadata(
            [worst_case] * num_rows,
            list(range(num_rows)),
            [1] * num_rows,
            vocab_size=logits.shape[-1],
            prompt_token_ids=[[1, 2]] * num_rows,
            output_token_ids=[[3]] * num_rows,
            device=self.device,
        )
        self.sampler(logits, metadata)
        del caches

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
        hidden = self.model(
            inputs.input_ids, inputs.positions, self.kv_caches, inputs.attn_metadata
        )
        sampled_ids = [-1] * len(requests)
        if not sampling_requests:
            return RunnerOutput(sampled_token_ids=sampled_ids, logprobs=None)
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
        return RunnerOutput(sampled_token_ids=sampled_ids, logprobs=logprobs)
