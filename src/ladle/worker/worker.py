"""The Worker: one per rank, done once per process. Device, seed, model loading, the memory plan,
KV cache allocation, fp8 KV calibration and graph capture; then steps go to its ModelRunner.

Start-up order matters and is the same on every rank: load, build the Triton variants start-up
will run (a dry pass on a thread pool), calibrate fp8 KV scales (a real step over a temporary
cache), probe the peak of a worst-case step and of the largest graphs to size the KV pool,
allocate it, capture the graphs. Every probe is a made-up StepPlan through the runner's real
step path (dummy_batch.py), so the memory plan measures what serving allocates.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from dataclasses import dataclass

import torch

from ladle.attention.backend import get_attention_backend
from ladle.attention.kv_quant import FP8_KV_DTYPE, resolve_kv_cache_dtype
from ladle.config import EngineConfig, resolve_device, resolve_dtype
from ladle.distributed.fast_all_reduce import with_fast_all_reduce
from ladle.distributed.process_group import join_ranks, min_over_world, rank_device
from ladle.kernels.cpu_native.build import build_in_background
from ladle.kernels.parallel_builds import builds_only
from ladle.model.arch_config import ModelArchConfig
from ladle.model.load_errors import ModelLoadError
from ladle.model.loader import load_model
from ladle.model.weight_census import WeightCensus, take_census
from ladle.protocol.step import StepPlan
from ladle.spec_decode.placement import drafts_on_device
from ladle.startup_phases import StartupClock
from ladle.structured.manager import PendingGrammarBitmask
from ladle.worker import kv_calibration
from ladle.worker.builds_beside_loading import builds_beside_loading
from ladle.worker.cuda_graphs import DecodeGraphs
from ladle.worker.drafter_setup import drafter_bytes, load_drafter
from ladle.worker.drafts_on_device import DeviceDrafts, draft_kernels_enabled
from ladle.worker.dummy_batch import build_dummy_step
from ladle.worker.expert_dispatch_setup import prepare_expert_dispatch
from ladle.worker.expert_load import ExpertLoadMeter
from ladle.worker.forward_step import ForwardStep
from ladle.worker.fused_moe_setup import FusedMoeSetup, prepare_fused_moe
from ladle.worker.host_kv_pool import allocate_host_kv_pool
from ladle.worker.kv_cache_alloc import zeros_lazily
from ladle.worker.kv_copier import KVCopier, measure_copy_bandwidth
from ladle.worker.kv_peers import PeerPools, export_kv_pool
from ladle.worker.memory import MemoryBudget, host_tier_bytes, module_bytes, size_kv_cache
from ladle.worker.model_runner import LaunchedStep, ModelRunner
from ladle.worker.prefill_graphs import (
    graph_worthy_tokens,
    largest_prefill_bucket,
    request_buckets_for,
)
from ladle.worker.step_profiler import StepProfiler

# Decode batches above this run eagerly: past it, one step's kernels outlast their launches.
MAX_GRAPH_BATCH_SIZE = 512


@dataclass(frozen=True)
class WorkerInfo:
    """What the engine core learns of the workers at start-up (plain data: it crosses from a
    worker process as it is)."""

    device_type: str
    arch: ModelArchConfig
    model_path: str | None
    load_source: str
    max_model_len: int  # the model's (or the user's) limit, before the KV pool caps it
    memory_budget: MemoryBudget
    dtype: torch.dtype  # the weights' and activations'
    weights: WeightCensus  # this rank's
    # What start-up did for the fused MoE path (tile tuning), None without one.
    fused_moe: FusedMoeSetup | None = None
    # A producer's exported KV pool (worker/kv_peers.py), for consumers to pull from.
    kv_export: str | None = None
    # (phase, seconds) of this rank's start-up, in order (startup_phases.py).
    startup_phases: tuple[tuple[str, float], ...] = ()


class Worker:
    def __init__(
        self,
        config: EngineConfig,
        rank: int = 0,
        init_method: str | None = None,
        device_index: int | None = None,
    ) -> None:
        """init_method: where the ranks meet (torch.distributed's rendezvous) when there are
        several; the multi-process executor chooses it. device_index: the GPU this process
        uses where it sees only its own (a Ray actor); else GPU `rank`."""
        self.config = config
        self.rank = rank
        world_size = config.parallel.world_size
        self.device = rank_device(
            resolve_device(config.model.device), rank, world_size, device_index
        )
        self.dtype = resolve_dtype(config.model.dtype, self.device)
        self.step_profiler = StepProfiler.from_env(rank, self.device)
        on_cuda = self.device.type == "cuda"
        self.startup = StartupClock(
            settle=(lambda: torch.cuda.synchronize(self.device)) if on_cuda else None
        )
        block_size = config.cache.block_size
        # Every rank seeds alike: each samples the same tokens from the same gathered logits.
        torch.manual_seed(config.model.seed)
        parallel = config.parallel
        self.tp, self.stage = join_ranks(
            rank,
            parallel.tensor_parallel_size,
            parallel.pipeline_parallel_size,
            init_method,
            self.device,
            parallel.enable_expert_parallel,
        )
        self.tp = with_fast_all_reduce(
            self.tp, self.device, self.dtype, parallel.disable_custom_all_reduce
        )
        if self.device.type == "cpu":
            build_in_background()  # the C kernels build beside the load, not at the first step
        self.attention_backend = get_attention_backend(self.device)
        self.kv_cache_dtype = resolve_kv_cache_dtype(config.cache.kv_cache_dtype, self.dtype)
        # Where the modules are final before their weights, the Triton build pass runs beside
        # the load (builds_beside_loading.py), which then adopts the model early.
        self.model: torch.nn.Module | None = None
        self.built_beside_loading = False
        self.builds_beside_load_s = 0.0
        self.startup.add("model load", 0.0)  # first in the log, though the builds end first
        load_started = time.perf_counter()
        loaded = load_model(
            config.model, self.device, self.dtype, self.attention_backend, self.tp, self.stage,
            while_loading=functools.partial(builds_beside_loading, self),
        )  # fmt: skip
        if on_cuda:
            torch.cuda.synchronize(self.device)
        load_seconds = time.perf_counter() - load_started - self.builds_beside_load_s
        self.startup.add("model load", load_seconds)
        if loaded.model is not self.model:
            self.adopt_model(loaded.model, loaded.arch_config)
        self.model_path = loaded.model_path
        self.load_source = loaded.source
        speculative = config.scheduler.speculative
        if speculative is not None:
            self.runner.synthetic_acceptance = speculative.synthetic_acceptance
            if drafts_on_device(config, self.device.type):
                self.runner.device_drafts = DeviceDrafts(
                    self.device,
                    self.max_model_len,
                    speculative.prompt_lookup_min,
                    speculative.prompt_lookup_max,
                    speculative.synthetic_acceptance,
                    kernels=draft_kernels_enabled(self.device),
                )
            if speculative.uses_model_drafts:
                self.runner.drafter = load_drafter(
                    config, self.model, self.arch, self.device, self.dtype,
                    self.attention_backend, self.max_model_len,
                )
        drafter = self.runner.drafter
        if self.device.type == "cuda" and not self.model.can_capture_cuda_graphs:
            print(
                "[ladle] CUDA graphs off: this model's forward cannot be captured (its mixture "
                "of experts runs the torch path: LADLE_FUSED_KERNELS=0, Triton missing, or fp8 "
                "experts on a GPU older than Ada)",
                file=sys.stderr,
                flush=True,
            )
        if self.kv_cache_dtype == FP8_KV_DTYPE:
            kv_calibration.set_fp8_kv_scales(
                self.runner,
                self.arch.vocab_size,
                self.max_model_len,
                self.allocate_kv_caches,
                self.dtype,
                combine_amax=self.tp.all_reduce_max,
            )
        self.expert_load = ExpertLoadMeter(self.model)
        self.fused_moe: FusedMoeSetup | None = None
        if self.device.type == "cuda":
            self.fused_moe = prepare_fused_moe(
                self.model,
                self.dtype,
                max_tokens=min(config.scheduler.max_num_batched_tokens, self.max_model_len),
            )
            if self.fused_moe is not None:
                print(f"[ladle] {self.fused_moe.describe()}", file=sys.stderr, flush=True)
            if not self.built_beside_loading:
                with self.startup.phase("kernel builds"):
                    self._build_kernel_variants()
        # After the tiles: the timed layer runs as it will serve. Before the memory probe: its
        # steps take the dispatch they will serve with.
        self.expert_dispatch = prepare_expert_dispatch(
            self.model,
            self.tp,
            parallel.expert_parallel_dispatch,
            min(config.scheduler.max_num_batched_tokens, self.max_model_len),
            self.dtype,
        )
        if self.expert_dispatch is not None and self.tp.rank == 0:
            how = parallel.expert_parallel_dispatch
            print(f"[ladle] expert-parallel dispatch ({how}): {self.expert_dispatch.describe()}",
                  file=sys.stderr, flush=True)  # fmt: skip
        with self.startup.phase("memory probe"):
            self.memory_budget = size_kv_cache(
                config.cache,
                dataclasses.replace(
                    self.arch,
                    num_key_value_heads=self.num_kv_heads,
                    num_hidden_layers=self.num_layers,
                ),
                self.kv_cache_dtype,
                self.device,
                weights_bytes=module_bytes(self.model) + drafter_bytes(drafter),
                run_peak_forward=self._run_peak_forward,
                run_graph_probe=self._run_graph_probe if self.uses_graphs else None,
                # The draft network's pool shares the block ids: each block costs both.
                extra_kv_bytes_per_token=(
                    drafter.kv_bytes_per_token(self.dtype) if drafter is not None else 0
                ),
            )
        # One block table serves every rank: the rank with the least room sets the pool.
        num_blocks = min_over_world(self.memory_budget.num_blocks, self.device)
        if num_blocks != self.memory_budget.num_blocks:
            self.memory_budget = dataclasses.replace(
                self.memory_budget,
                num_blocks=num_blocks,
                kv_cache_bytes=num_blocks * self.memory_budget.block_bytes,
            )
        kv_started = time.perf_counter()
        num_host_blocks = 0
        if config.cache.enable_prefix_caching:  # the host tier works through block hashes
            num_host_blocks = (
                host_tier_bytes(config.cache, self.device) // self.memory_budget.block_bytes
            )
        # The same host block ids on every rank (the plans name them).
        num_host_blocks = min_over_world(num_host_blocks, self.device)
        # With a host tier the layers' caches are views of one tensor (kv_copier.py: one gather
        # moves a batch of blocks of every layer); without one, nothing changes.
        kv_transfer = config.cache.kv_transfer
        self.kv_export: str | None = None
        if kv_transfer is not None:
            if world_size > 1:
                raise ValueError(
                    "kv_transfer_config with tensor or pipeline parallelism is not supported "
                    "yet: run each disaggregated instance on one GPU"
                )
            self.runner.kv_peers = PeerPools()
        if kv_transfer is not None and kv_transfer.is_producer:
            # A pool consumers can map: its per-layer caches are views of one exported tensor.
            shape = (
                self.num_layers, 2, self.memory_budget.num_blocks, block_size,
                self.num_kv_heads, self.arch.head_dim,
            )
            pool, self.kv_export = export_kv_pool(shape, self.kv_cache_dtype, self.device)
            self.runner.kv_caches = list(pool.unbind(0))
        else:
            # Stacked with a host tier (kv_copier.py: one gather moves a batch of blocks of
            # every layer) or as a consumer (a pull writes every layer at once).
            self.runner.kv_caches = self.allocate_kv_caches(
                self.memory_budget.num_blocks,
                stacked=num_host_blocks > 0 or kv_transfer is not None,
            )
        if drafter is not None:
            drafter.kv_caches = self._allocate_draft_caches(self.memory_budget.num_blocks)
        if num_host_blocks > 0:
            self._allocate_host_tier(num_host_blocks)
        self.startup.add("KV cache", time.perf_counter() - kv_started)
        # On CUDA a step that fits a graph bucket takes its graph's launches even when run
        # eagerly (enforce_eager, or the rare step that misses), so graphs never change results.
        if self.device.type == "cuda":
            graphs = self.runner.graph_buckets = self._graph_buckets()
            if self.uses_graphs:
                with self.startup.phase("graph capture"):
                    graphs.capture()
                self.memory_budget = dataclasses.replace(
                    self.memory_budget, graph_pool_bytes=graphs.pool_bytes
                )

    @property
    def info(self) -> WorkerInfo:
        return WorkerInfo(
            device_type=self.device.type,
            arch=self.arch,
            model_path=self.model_path,
            load_source=self.load_source,
            max_model_len=self.max_model_len,
            memory_budget=self.memory_budget,
            dtype=self.dtype,
            weights=take_census(self.model),
            fused_moe=self.fused_moe,
            kv_export=self.kv_export,
            startup_phases=tuple(self.startup.phases),
        )

    @property
    def kv_caches(self) -> list[torch.Tensor]:
        """The KV cache, one [2, blocks, block_size, kv heads, head dim] tensor per layer."""
        return self.runner.kv_caches

    @property
    def sends_results(self) -> bool:
        """Whether this rank's step results go to the engine (the last pipeline stage's first
        rank: it has the logits, hence logprobs)."""
        return self.rank == self.stage.result_rank

    @property
    def block_size(self) -> int:
        return self.runner.block_size

    @property
    def graphs(self) -> DecodeGraphs | None:
        """The captured CUDA graphs; None in eager mode and on the CPU."""
        return self.runner.graphs

    # ----- steps ---------------------------------------------------------------------------

    def execute(
        self, plan: StepPlan, grammar_bitmask: PendingGrammarBitmask | None = None
    ) -> LaunchedStep:
        if self.step_profiler is not None:
            self.step_profiler.step_starts()
        return self.runner.execute(plan, grammar_bitmask)

    def launch_forward(self, plan: StepPlan) -> ForwardStep:
        if self.step_profiler is not None:
            self.step_profiler.step_starts()
        return self.runner.launch_forward(plan)

    def sample(
        self, forward: ForwardStep, grammar_bitmask: PendingGrammarBitmask | None = None
    ) -> LaunchedStep:
        return self.runner.sample(forward, grammar_bitmask)

    # ----- start-up ------------------------------------------------------------------------

    def adopt_model(self, model: torch.nn.Module, arch_config: ModelArchConfig) -> None:
        """Take the model (its weights may still be loading) and build what needs only its
        shapes: the length limit, this rank's KV shape, the runner, whether graphs are used."""
        config = self.config
        self.model = model
        self.arch = arch_config
        self.max_model_len = self._resolve_max_model_len()
        # This rank's share of the key/value heads, for its stage's layers: its KV cache holds
        # only those.
        self.num_kv_heads = self.tp.kv_heads_per_rank(self.arch.num_key_value_heads)
        self.num_layers = len(self.stage.layer_range(self.arch.num_hidden_layers))
        block_size = config.cache.block_size
        self.runner = ModelRunner(
            model,
            self.device,
            block_size,
            max_blocks_per_seq=-(-self.max_model_len // block_size),
            initial_slots=config.scheduler.max_num_seqs + 8,
            stage=self.stage,
            activation_dtype=self.dtype,
        )
        # Decode steps replay CUDA graphs unless the user asked for eager mode (CUDA only) or
        # the model's forward reads device values on the host (the torch MoE path).
        self.uses_graphs = (
            self.device.type == "cuda"
            and not config.model.enforce_eager
            and model.can_capture_cuda_graphs
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

    def allocate_kv_caches(
        self, num_blocks: int, dtype: torch.dtype | None = None, stacked: bool = False
    ) -> list[torch.Tensor]:
        """One [2, num_blocks, block_size, kv heads, head dim] tensor per layer; stacked: views
        of one [layers, 2, ...] allocation (the same per-layer tensors, one storage)."""
        block_size = self.config.cache.block_size
        shape = (2, num_blocks, block_size, self.num_kv_heads, self.arch.head_dim)
        dtype = dtype or self.kv_cache_dtype
        if stacked:
            return list(zeros_lazily((self.num_layers, *shape), dtype, self.device).unbind(0))
        return [zeros_lazily(shape, dtype, self.device) for _ in range(self.num_layers)]

    def _allocate_draft_caches(self, num_blocks: int) -> list[torch.Tensor]:
        """The draft network's paged pool: the target's block ids, in the model's dtype."""
        drafter = self.runner.drafter
        assert drafter is not None
        shape = drafter.cache_shape(num_blocks)
        return [zeros_lazily(shape, self.dtype, self.device) for _ in range(drafter.num_layers)]

    def _allocate_host_tier(self, num_host_blocks: int) -> None:
        """The KV cache's host tier: its pool, the copier the runner issues the plans' KV
        operations through, and the copy bandwidth the swap-or-recompute rule uses."""
        host_pool = allocate_host_kv_pool(
            self.num_layers,
            num_host_blocks,
            tuple(self.runner.kv_caches[0].shape[2:]),
            self.kv_cache_dtype,
            self.device,
        )
        self.runner.kv_copier = KVCopier(host_pool, self.device)
        self.memory_budget = dataclasses.replace(
            self.memory_budget,
            num_host_blocks=num_host_blocks,
            copy_bytes_per_s=measure_copy_bandwidth(self.device),
        )

    @torch.inference_mode()
    def _run_probe_step(self, num_tokens: int, num_reqs: int, forward_only: bool = False) -> None:
        """One step of made-up requests through the real step path (execute), every write going
        to the null block of a one-block cache: what a real step of that size allocates.
        forward_only: launch the forward and logits, not the sampler."""
        runner = self.runner
        step = build_dummy_step(num_tokens, num_reqs, runner.block_size)
        real_caches, runner.kv_caches = runner.kv_caches, self.allocate_kv_caches(1)
        drafter = runner.drafter
        real_draft_caches = drafter.kv_caches if drafter is not None else []
        if drafter is not None:
            drafter.kv_caches = self._allocate_draft_caches(1)
        try:
            if forward_only:
                runner.launch_forward(step)
            else:
                runner.execute(step).result()
        finally:
            runner.kv_caches = real_caches
            if drafter is not None:
                drafter.kv_caches = real_draft_caches
            runner.forget(step.request_ids())

    def _build_kernel_variants(self) -> None:
        """Build the Triton variants of the forward passes that start-up will run (the memory
        probe's steps, a one-request decode, short prompts) on a thread pool, before any of
        them runs: one dry pass submits every build, then they build side by side instead of
        one at a time on first use (kernels/parallel_builds.py). The sampler's few variants
        still build on first use (its host side reads what its kernels write)."""
        with builds_only() as active:
            if active:
                self.submit_kernel_builds()
        torch.cuda.synchronize(self.device)

    def submit_kernel_builds(self) -> None:
        """The build pass's dry steps; inside builds_only, so they only submit builds."""
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
        for num_tokens, num_reqs in shapes:
            self._run_probe_step(num_tokens, num_reqs, forward_only=True)

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
        if self.stage.size > 1:
            return 0  # a pipeline stage captures decode steps only (cuda_graphs.py)
        layer_params = sum(
            p.numel() for name, p in self.model.named_parameters() if "layers." in name
        )
        worthy = graph_worthy_tokens(self.arch.num_hidden_layers, layer_params)
        return min(self.config.scheduler.max_num_batched_tokens, self.max_model_len, worthy)

    def _graph_max_batch_size(self) -> int:
        return min(self.config.scheduler.max_num_seqs, MAX_GRAPH_BATCH_SIZE)

    def _graph_buckets(self) -> DecodeGraphs:
        """The graphs' buckets, captured only when graphs are on."""
        runner = self.runner

        def forward(input_ids, positions, metadata, intermediate=None):
            return self.model(input_ids, positions, runner.kv_caches, metadata, intermediate)

        stage_input = None
        if not self.stage.is_first:
            stage_input = (self.arch.hidden_size, runner.activation_dtype)
        return DecodeGraphs(
            forward,
            max_batch_size=self._graph_max_batch_size(),
            max_blocks_per_seq=runner.batch.max_blocks_per_seq,
            block_size=runner.block_size,
            device=self.device,
            prefill_max_tokens=self._prefill_graph_max_tokens(),
            stage_input=stage_input,
        )
