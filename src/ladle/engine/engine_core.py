"""EngineCore: schedule -> submit -> update, one step at a time.

It holds the scheduler, the KV cache manager and the executor (which runs the workers), and
speaks only in EngineCoreRequest / EngineCoreOutput, so it runs the same in-process (offline LLM)
or in its own process behind ZMQ (the server). Between the scheduler and the workers travel only
plain StepPlans and StepResults (protocol/step.py).
"""

from __future__ import annotations

import dataclasses
import random
import sys
import time
from collections import deque
from dataclasses import dataclass

from ladle.config import EngineConfig
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.kv_handoff import disaggregation_stats
from ladle.core.kv_transfers import write_back_window
from ladle.core.preemption_cost import PreemptionPolicy
from ladle.core.request import Request, RequestStatus
from ladle.core.scheduler import Scheduler
from ladle.engine.handoff_params import apply_transfer_params, handoff_params
from ladle.engine.overlap import overlap_enabled, steps_in_flight
from ladle.engine.prompt_logprobs import PromptLogprobsCollector
from ladle.engine.slow_step_log import log_slow_step, slow_step_threshold_s
from ladle.engine.step_meter import StepMeter
from ladle.engine.warmup import describe_startup, warm_up
from ladle.executor.base import Executor, StepFuture
from ladle.executor.factory import build_executor
from ladle.kernels.compile_log import start_compile_log
from ladle.protocol.messages import (
    EngineCoreOutput,
    EngineCoreRequest,
    RequestRejectedError,
    SchedulerStats,
)
from ladle.protocol.step import KVTransferStats, StepPlan, StepResult
from ladle.sampling.limits import check_field, check_top_k
from ladle.spec_decode.governor_trace import governor_trace_from_env
from ladle.spec_decode.placement import drafts_on_device
from ladle.spec_decode.speculator import Speculator
from ladle.startup_phases import describe_startup_phases
from ladle.structured.engine_side import build_structured_output_manager
from ladle.structured.manager import PendingGrammarBitmask
from ladle.threads import ThreadGovernor

# An engine with nothing to run but requests whose grammar is compiling waits this long for one.
GRAMMAR_WAIT_S = 0.005


@dataclass
class InFlightStep:
    """A submitted step whose result the engine has not read yet (outputs: once it has)."""

    future: StepFuture
    outputs: list[EngineCoreOutput] | None = None


class EngineCore:
    def __init__(
        self, config: EngineConfig, print_budget: bool = True, executor: Executor | None = None
    ) -> None:
        start_compile_log()  # start-up reports the Triton kernels it built
        started = time.perf_counter()
        self.config = config
        self.executor = executor if executor is not None else build_executor(config)
        info = self.info = self.executor.info
        # Where start-up's seconds went (rank 0's phases; `ladle bench startup` reads the line).
        self.startup_phases = list(info.startup_phases)
        timed = sum(seconds for _, seconds in info.startup_phases)
        self.startup_phases.append(("worker set-up", time.perf_counter() - started - timed))
        self.vocab_size = info.arch.vocab_size
        budget = info.memory_budget
        # A sequence longer than the pool could never run: the pool caps the model length, so
        # a request without max_tokens gets room it can actually use.
        self.max_model_len = min(info.max_model_len, budget.num_token_slots)
        self._length_limit = f"max_model_len={self.max_model_len}"
        if self.max_model_len < info.max_model_len:
            self._length_limit += f" (the KV cache pool holds {budget.num_token_slots} tokens)"
        if print_budget:
            # stderr: stdout belongs to what the user asked for (generated text, JSON).
            print(f"[ladle] {budget.describe()}", file=sys.stderr, flush=True)
            if self.max_model_len < info.max_model_len:
                print(
                    f"[ladle] max_model_len lowered from {info.max_model_len} to "
                    f"{self.max_model_len}: the KV cache pool holds no more",
                    file=sys.stderr,
                    flush=True,
                )
        self.kv_cache_manager = KVCacheManager(
            num_blocks=budget.num_blocks,
            block_size=config.cache.block_size,
            enable_caching=config.cache.enable_prefix_caching,
            num_host_blocks=budget.num_host_blocks,
            write_back_window=write_back_window(
                config.scheduler.max_num_batched_tokens,
                config.scheduler.max_num_seqs,
                config.cache.block_size,
            ),
        )
        if config.scheduler.preemption_mode == "swap" and not self.kv_cache_manager.host_tier:
            raise ValueError(
                "preemption_mode 'swap' needs the KV cache's host tier: set kv_offloading_size "
                "> 0 (and keep prefix caching on), or use recompute / auto"
            )
        speculative = config.scheduler.speculative
        # Drafts for decodes (speculative decoding); None when the config has no
        # speculative_config.
        self.speculator = None
        if speculative is not None:
            self.speculator = Speculator(
                speculative,
                report=_print_ladle_line if print_budget else None,
                trace=governor_trace_from_env(),
            )
        self.overlaps = overlap_enabled(config.scheduler, info.device_type)
        # Submitted steps kept unread at most: 2 with overlap, one per pipeline stage under
        # pipeline parallelism (micro-batches, engine/overlap.py), else 1.
        num_stages = config.parallel.pipeline_parallel_size
        self.max_in_flight = steps_in_flight(config.scheduler, num_stages, info.device_type)
        self.scheduler = Scheduler(
            config.scheduler,
            config.cache,
            self.kv_cache_manager,
            self.max_model_len,
            preemption=PreemptionPolicy(
                mode=config.scheduler.preemption_mode,
                block_size=config.cache.block_size,
                block_bytes=budget.block_bytes,
                copy_bytes_per_s=budget.copy_bytes_per_s,
            ),
            proposer=self.speculator,
            num_micro_batches=self.max_in_flight if num_stages > 1 else 1,
        )
        # What the host tier's copies moved, as the workers report it.
        self.kv_transfer_totals = KVTransferStats()
        # Seeds for requests that bring none; drawn from the engine seed so runs repeat.
        self._seed_source = random.Random(config.model.seed)
        self.prompt_logprobs = PromptLogprobsCollector()
        self.step_meter = StepMeter()
        self.slow_step_s = slow_step_threshold_s()
        # On the CPU, torch's thread team follows the cores other programs leave free.
        self.thread_governor = ThreadGovernor() if info.device_type == "cpu" else None
        self.structured_outputs = build_structured_output_manager(
            config, info, self.executor.grammar_device
        )
        self.scheduler.drafts_on_device = drafts_on_device(config, info.device_type)
        # Submitted steps whose results are not read yet, oldest first.
        self._in_flight: deque[InFlightStep] = deque()
        self._graph_steps_before = 0
        # Last: the warm-up runs real steps, which need everything above.
        if info.device_type == "cuda":
            # Compile every kernel variant now, through the real step, not under a first user.
            warmup_started = time.perf_counter()
            num_steps = warm_up(self)
            warmup_seconds = time.perf_counter() - warmup_started
            self.startup_phases.append(("warm-up", warmup_seconds))
            if print_budget:
                report = describe_startup(self, num_steps, warmup_seconds)
                print(f"[ladle] {report}", file=sys.stderr, flush=True)
        # The memory probes' and the warm-up's made-up tokens are no expert's load.
        self.executor.reset_expert_load()
        self.startup_phases.append(("engine total", time.perf_counter() - started))
        if print_budget:
            print(describe_startup_phases(self.startup_phases), file=sys.stderr, flush=True)

    # ----- requests ------------------------------------------------------------------------

    def add_request(self, core_request: EngineCoreRequest) -> None:
        """Queue a request, or raise RequestRejectedError if it can never run."""
        prompt = core_request.prompt_token_ids
        params = core_request.sampling_params
        self._validate_prompt(prompt)
        check_field("priority", core_request.priority)
        check_top_k(params.top_k, self.vocab_size)
        for name in ("logprobs", "prompt_logprobs"):
            asked = getattr(params, name)
            if asked is not None and asked > self.config.model.max_logprobs:
                raise RequestRejectedError(
                    f"{name}: {asked} requested, but this server allows at most "
                    f"{self.config.model.max_logprobs} (--max-logprobs)"
                )
        room = self.max_model_len - len(prompt)
        if params.max_tokens is None:
            params = dataclasses.replace(params, max_tokens=room)
        elif params.max_tokens > room:
            raise RequestRejectedError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                f"model length limit {self._length_limit}"
            )
        scheduler_config = self.config.scheduler
        if (
            not scheduler_config.enable_chunked_prefill
            and len(prompt) > scheduler_config.max_num_batched_tokens
        ):
            raise RequestRejectedError(
                f"the prompt has {len(prompt)} tokens, more than max_num_batched_tokens="
                f"{scheduler_config.max_num_batched_tokens}, and chunked prefill is off"
            )
        request = Request(
            request_id=core_request.request_id,
            prompt_token_ids=list(prompt),
            sampling_params=params,
            eos_token_ids=tuple(core_request.eos_token_ids),
            priority=core_request.priority,
            arrival_time=core_request.arrival_time or time.monotonic(),
            cache_salt=params.cache_salt,
        )
        request.sampling_seed = (
            params.seed if params.seed is not None else self._seed_source.getrandbits(31)
        )
        if core_request.kv_transfer_params is not None:
            apply_transfer_params(
                request,
                core_request.kv_transfer_params,
                self.config.cache.kv_transfer,
                self.config.cache.block_size,
                self.vocab_size,
            )
        if params.structured_outputs is not None:
            if self.structured_outputs is None:
                raise RequestRejectedError(
                    "structured output needs the model's tokenizer, and this model has none"
                )
            if core_request.request_id in self.scheduler.requests:
                raise RequestRejectedError(f"request id {request.request_id!r} is in use")
            if not self.structured_outputs.add_request(request):
                return  # waits for its grammar outside the scheduler; step() hands it over
        self.scheduler.add_request(request)

    def _validate_prompt(self, prompt: list[int]) -> None:
        if not prompt:
            raise RequestRejectedError("the prompt is empty; give at least one token")
        if len(prompt) >= self.max_model_len:
            raise RequestRejectedError(
                f"the prompt has {len(prompt)} tokens, which leaves no room to generate within "
                f"{self._length_limit}"
            )
        lowest, highest = min(prompt), max(prompt)
        if lowest < 0 or highest >= self.vocab_size:
            bad = lowest if lowest < 0 else highest
            raise RequestRejectedError(
                f"prompt token id {bad} is outside the vocabulary [0, {self.vocab_size})"
            )

    def abort_requests(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        """End requests now and free their blocks; returns their final 'abort' outputs."""
        finished = self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        if self.scheduler.handoffs is not None:
            # An abort also releases a handed-off prompt's blocks: the consumer has them (or
            # will never pull them).
            self.scheduler.handoffs.release(request_ids)
        finished_ids = [r.request_id for r in finished]
        # Requests still waiting for their grammar were never scheduled: they end here too.
        finished_ids += self._forget(request_ids)
        self._forget_when_idle()
        return [
            EngineCoreOutput(request_id=request_id, new_token_ids=[], finish_reason="abort")
            for request_id in finished_ids
        ]

    # ----- the loop ------------------------------------------------------------------------

    def step(self) -> list[EngineCoreOutput]:
        """Schedule and submit one step; return the outputs of the oldest step in flight once
        max_in_flight are (the step before it with overlapped scheduling, the one S - 1 before
        it with S pipeline stages), or of this one (synchronous). A step whose sampling reads
        host tokens reads the step before it between its forward pass and its sampling
        (split_launch.py)."""
        started = time.perf_counter()
        if self.thread_governor is not None:
            self.thread_governor.maybe_adjust()
        self.expire_handoffs()
        outputs = self._admit_compiled_requests()
        plan = self.scheduler.schedule()
        in_flight = self._in_flight
        submitted = self._submit(plan, in_flight[-1] if in_flight else None)
        if submitted is not None:
            in_flight.append(submitted)
            if plan.kv_operations:
                # Loads settled now run in the next plan, not the one after (overlapped
                # scheduling reads this step's result only after planning the next).
                launched = submitted.future.kv_operations_at_launch()
                if launched is not None:
                    self.scheduler.settle_kv_operations(*launched)
        launch_seconds = time.perf_counter() - started
        previous = None
        if in_flight and (submitted is None or len(in_flight) >= self.max_in_flight):
            previous = in_flight.popleft()
            outputs += self._read(previous)  # the device runs the later steps meanwhile
        self._after_step(plan, previous, outputs, started, launch_seconds)
        if self.speculator is not None and not self.has_unfinished_requests():
            self.speculator.went_idle()
        return outputs

    @property
    def in_flight_plans(self) -> list[StepPlan]:
        """The plans of the submitted steps not read yet, oldest first."""
        return [step.future.plan for step in self._in_flight]

    def _submit(self, plan: StepPlan, previous: InFlightStep | None) -> InFlightStep | None:
        """Hand the plan to the executor (also a plan with nothing scheduled that tells the
        workers what to forget). With a step in flight and rows that sample from host tokens,
        that step is read between this one's forward pass and its sampling."""
        self._graph_steps_before = self.executor.num_graph_steps
        if not (
            plan.scheduled
            or plan.finished_request_ids
            or plan.preempted_request_ids
            or plan.kv_operations
        ):
            return None
        between = None
        # Micro-batches never hold a request whose token is in flight: nothing to wait for.
        pipelined = self.scheduler.micro_batches is not None
        if previous is not None and plan.samples_from_host_tokens and not pipelined:
            between = lambda: self._settle(previous)  # noqa: E731
        return InFlightStep(self.executor.submit(plan, self._grammar_fill(), between))

    def _after_step(
        self,
        plan: StepPlan,
        previous: InFlightStep | None,
        outputs: list[EngineCoreOutput],
        started: float,
        launch_seconds: float,
    ) -> None:
        graphed = self.executor.num_graph_steps > self._graph_steps_before
        self._record_step(plan, previous, started, launch_seconds, graphed)
        if self.speculator is not None:
            self.speculator.observe_outputs(
                sum(len(o.new_token_ids) for o in outputs), plan.num_prefill_tokens > 0
            )
        if not plan.scheduled and not outputs:
            self._wait_for_grammars()
        self._forget_when_idle()

    def _forget_when_idle(self) -> None:
        """With nothing left to run, tell the workers now to drop what they hold of ended
        requests (slots, penalty rows), instead of with the next request's first step."""
        scheduler = self.scheduler
        # Copies to the host tier still to issue or settle pin their blocks: settle them too
        # (at most two rounds: the first plan issues them, its result settles them).
        for _ in range(2):
            if not (
                not self._in_flight
                and (scheduler.has_requests_to_forget or scheduler.has_kv_transfers)
                and not scheduler.has_unfinished_requests()
            ):
                return
            plan = scheduler.schedule()
            result = self.executor.submit(plan).result()
            self._count_kv_transfer(result)
            scheduler.update_from_output(plan, result)

    def _count_kv_transfer(self, result: StepResult) -> None:
        stats = result.kv_transfer
        if stats is not None:
            totals = self.kv_transfer_totals
            totals.bytes_to_host += stats.bytes_to_host
            totals.bytes_to_device += stats.bytes_to_device
            totals.copy_seconds += stats.copy_seconds
            totals.load_seconds += stats.load_seconds
            totals.num_pulls += stats.num_pulls
            totals.bytes_pulled += stats.bytes_pulled
            totals.pull_seconds += stats.pull_seconds

    def _grammar_fill(self):
        structured = self.structured_outputs
        return self._start_grammar_fill if structured is not None else None

    def _start_grammar_fill(self, plan: StepPlan) -> PendingGrammarBitmask | None:
        """Start filling the plan's grammar rows' masks (one row per sampling row)."""
        assert self.structured_outputs is not None
        rows = [
            (plan.scheduled[position].request_id,
             plan.scheduled[position].draft_token_ids[:offset])
            for position, offset in plan.sampling_rows()
        ]
        return self.structured_outputs.start_fill(rows)

    def _wait_for_grammars(self) -> None:
        """Nothing ran: if requests wait for their grammar, wait a moment for one."""
        structured = self.structured_outputs
        if structured is not None and structured.num_waiting and not self._in_flight:
            structured.wait_for_compile(GRAMMAR_WAIT_S)

    def _record_step(
        self,
        plan: StepPlan,
        previous: InFlightStep | None,
        started: float,
        launch_seconds: float,
        graphed: bool,
    ) -> None:
        if not plan.scheduled:
            return
        num_prefill, num_decode = plan.num_prefill_tokens, plan.num_decode_tokens
        seconds = time.perf_counter() - started
        self.step_meter.record(num_prefill, num_decode, seconds)
        if self.slow_step_s is not None and seconds > self.slow_step_s:
            previous_plan = previous.future.plan if previous is not None else None
            log_slow_step(seconds, launch_seconds, graphed, plan, previous_plan)
        if self.scheduler.prefill_budget is not None:
            self.scheduler.prefill_budget.observe(num_prefill + num_decode, seconds)
        if num_prefill:
            # What `auto` preemption weighs a recompute with (core/preemption_cost.py).
            self.scheduler.preemption.prefill_tokens_per_s = self.step_meter.prefill_tokens_per_s

    def _read(self, in_flight: InFlightStep) -> list[EngineCoreOutput]:
        """A submitted step's outputs, reading it first if a split launch has not already."""
        self._settle(in_flight)
        outputs, in_flight.outputs = in_flight.outputs, []
        return outputs

    def _settle(self, in_flight: InFlightStep) -> None:
        """Wait for a submitted step's result and hand it to the scheduler (once), keeping
        its outputs on in_flight until the step that returns them takes them."""
        if in_flight.outputs is not None:
            return
        future = in_flight.future
        result = future.result()
        self._count_kv_transfer(result)
        outputs = self._end_failed(result.failed)
        if self.structured_outputs is not None:
            self.structured_outputs.accept_tokens(result.request_ids, result.token_ids)
        self.prompt_logprobs.add(result.prompt_logprobs)
        step_outputs = self.scheduler.update_from_output(future.plan, result)
        if result.drafting_seconds and self.speculator is not None:
            self.speculator.add_drafting_seconds(result.drafting_seconds)
        self._describe_handoffs(step_outputs)
        self.prompt_logprobs.attach(step_outputs)
        outputs += step_outputs
        self._release_finished(outputs)
        in_flight.outputs = outputs

    def expire_handoffs(self) -> None:
        """Free handed-off prompts no consumer pulled within the hold timeout."""
        if self.scheduler.handoffs is not None:
            self.scheduler.handoffs.expire()

    def _describe_handoffs(self, outputs: list[EngineCoreOutput]) -> None:
        """Tell the API process where each handed-off prompt's KV is (kv_handoff.py)."""
        handoffs = self.scheduler.handoffs
        for output in outputs:
            if output.finish_reason != "remote_decode" or handoffs is None:
                continue
            held = handoffs.describe(output.request_id)
            if held is not None:
                block_ids, seed, expires_at = held
                output.kv_transfer_params = handoff_params(
                    output.request_id,
                    block_ids,
                    self.info.kv_export or "",
                    self.config.cache.block_size,
                    seed,
                    expires_at,
                )

    def _end_failed(self, failed: dict[str, str]) -> list[EngineCoreOutput]:
        """End the requests a step failed on (each alone: the rest of the step ran)."""
        if not failed:
            return []
        ended = self.scheduler.finish_requests(list(failed), RequestStatus.FINISHED_REJECTED)
        return [
            EngineCoreOutput(
                request_id=request.request_id,
                new_token_ids=[],
                finish_reason="error",
                error=f"the engine failed on this request and ended it: "
                f"{failed[request.request_id]}",
            )
            for request in ended
        ]

    def _release_finished(self, outputs: list[EngineCoreOutput]) -> None:
        finished_ids = [output.request_id for output in outputs if output.finished]
        if finished_ids:
            self._forget(finished_ids)

    def _forget(self, request_ids: list[str]) -> list[str]:
        """Drop what the engine keeps per request outside the scheduler (the workers forget
        through the next plan): pending prompt logprobs and the grammar. Returns the ids that
        were still waiting for their grammar compile (never handed to the scheduler)."""
        self.prompt_logprobs.discard(request_ids)
        if self.structured_outputs is None:
            return []
        return self.structured_outputs.remove(request_ids)

    def _admit_compiled_requests(self) -> list[EngineCoreOutput]:
        """Hand requests whose grammar is compiled to the scheduler; end those that failed."""
        if self.structured_outputs is None:
            return []
        ready, failed = self.structured_outputs.take_ready()
        for request in ready:
            self.scheduler.add_request(request)
        outputs = [
            EngineCoreOutput(request_id=request.request_id, new_token_ids=[], finish_reason="error")
            for request, _ in failed
        ]
        self._release_finished(outputs)
        return outputs

    def has_unfinished_requests(self) -> bool:
        waiting_for_grammar = self.structured_outputs is not None and (
            self.structured_outputs.num_waiting > 0
        )
        return (
            self.scheduler.has_unfinished_requests()
            or waiting_for_grammar
            or bool(self._in_flight)
        )

    def get_stats(self) -> SchedulerStats:
        meter = self.step_meter
        return dataclasses.replace(
            self.scheduler.get_stats(),
            prefill_tokens_per_s=meter.prefill_tokens_per_s,
            mean_step_time_s=meter.mean_step_time_s,
            num_prefill_tokens=meter.num_prefill_tokens,
            num_decode_tokens=meter.num_decode_tokens,
            prefill_step_counts=tuple(meter.prefill_step_counts),
            decode_step_counts=tuple(meter.decode_step_counts),
            prefill_step_seconds=meter.prefill_step_seconds,
            decode_step_seconds=meter.decode_step_seconds,
            num_graph_steps=self.executor.num_graph_steps,
            num_eager_steps=self.executor.num_eager_steps,
            expert_token_counts=self.executor.expert_token_counts(),
            kv_bytes_to_host=self.kv_transfer_totals.bytes_to_host,
            kv_bytes_to_device=self.kv_transfer_totals.bytes_to_device,
            kv_copy_seconds=self.kv_transfer_totals.copy_seconds,
            kv_load_seconds=self.kv_transfer_totals.load_seconds,
            **disaggregation_stats(
                self.scheduler.handoffs, self.scheduler.pulls, self.kv_transfer_totals
            ),
            spec_decode=(
                self.speculator.stats.snapshot() if self.speculator is not None else None
            ),
        )


def _print_ladle_line(line: str) -> None:
    print(f"[ladle] {line}", file=sys.stderr, flush=True)
