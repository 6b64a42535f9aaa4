"""EngineCore: schedule -> execute -> update, one step at a time.

It holds the scheduler, the KV cache manager and the model runner, and speaks only in
EngineCoreRequest / EngineCoreOutput, so it runs the same in-process (offline LLM) or in its own
process behind ZMQ (the server).
"""

from __future__ import annotations

import dataclasses
import functools
import random
import sys
import time

from ladle.config import EngineConfig
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.request import Request, RequestStatus
from ladle.core.scheduler import Scheduler
from ladle.engine.fault_isolation import execute_isolating_faults
from ladle.engine.messages import (
    EngineCoreOutput,
    EngineCoreRequest,
    RequestRejectedError,
    SchedulerStats,
)
from ladle.engine.overlap import InFlightStep, OverlapPolicy
from ladle.engine.prompt_logprobs import PromptLogprobsCollector
from ladle.engine.slow_step_log import log_slow_step, slow_step_threshold_s
from ladle.engine.split_launch import SplitLaunch
from ladle.engine.step_meter import StepMeter
from ladle.engine.warmup import describe_startup, warm_up
from ladle.kernels.compile_log import start_compile_log
from ladle.sampling_limits import check_field, check_top_k
from ladle.structured.engine_side import build_structured_output_manager
from ladle.threads import ThreadGovernor
from ladle.worker.model_runner import ModelRunner

# An engine with nothing to run but requests whose grammar is compiling waits this long for one.
GRAMMAR_WAIT_S = 0.005


class EngineCore:
    def __init__(self, config: EngineConfig, print_budget: bool = True) -> None:
        start_compile_log()  # start-up reports the Triton kernels it built
        self.config = config
        self.runner = ModelRunner(config)
        self.vocab_size = self.runner.arch.vocab_size
        budget = self.runner.memory_budget
        # A sequence longer than the pool could never run: the pool caps the model length, so
        # a request without max_tokens gets room it can actually use.
        self.max_model_len = min(self.runner.max_model_len, budget.num_token_slots)
        self._length_limit = f"max_model_len={self.max_model_len}"
        if self.max_model_len < self.runner.max_model_len:
            self._length_limit += f" (the KV cache pool holds {budget.num_token_slots} tokens)"
        if print_budget:
            # stderr: stdout belongs to what the user asked for (generated text, JSON).
            print(f"[ladle] {budget.describe()}", file=sys.stderr, flush=True)
            if self.max_model_len < self.runner.max_model_len:
                print(
                    f"[ladle] max_model_len lowered from {self.runner.max_model_len} to "
                    f"{self.max_model_len}: the KV cache pool holds no more",
                    file=sys.stderr,
                    flush=True,
                )
        self.kv_cache_manager = KVCacheManager(
            num_blocks=budget.num_blocks,
            block_size=config.cache.block_size,
            enable_caching=config.cache.enable_prefix_caching,
        )
        self.scheduler = Scheduler(
            config.scheduler, config.cache, self.kv_cache_manager, self.max_model_len
        )
        # Seeds for requests that bring none; drawn from the engine seed so runs repeat.
        self._seed_source = random.Random(config.model.seed)
        self.prompt_logprobs = PromptLogprobsCollector()
        self.step_meter = StepMeter()
        self.slow_step_s = slow_step_threshold_s()
        # On the CPU, torch's thread team follows the cores other programs leave free.
        self.thread_governor = ThreadGovernor() if self.runner.device.type == "cpu" else None
        self.structured_outputs = build_structured_output_manager(config, self.runner)
        self.overlap = OverlapPolicy.from_config(config.scheduler, self.runner.device)
        self._in_flight: InFlightStep | None = None  # launched, its sampled ids not yet read
        # Last: the warm-up runs real steps, which need everything above.
        if self.runner.device.type == "cuda":
            # Compile every kernel variant now, through the real step, not under a first user.
            started = time.perf_counter()
            num_steps = warm_up(self)
            if print_budget:
                report = describe_startup(self, num_steps, time.perf_counter() - started)
                print(f"[ladle] {report}", file=sys.stderr, flush=True)

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
        if params.structured_outputs is not None:
            if self.structured_outputs is None:
                raise RequestRejectedError(
                    "structured output needs the model's tokenizer, and this model has none"
                )
            if core_request.request_id in self.scheduler.requests:
                raise RequestRejectedError(f"request id {request.request_id!r} is in use")
            if not self.structured_outputs.add_request(request):
                return  # waits for its grammar outside the scheduler; step() hands it over
        self.overlap.track(request)
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
        finished_ids = [r.request_id for r in finished]
        # Requests still waiting for their grammar were never scheduled: they end here too.
        finished_ids += self._forget(request_ids)
        return [
            EngineCoreOutput(request_id=request_id, new_token_ids=[], finish_reason="abort")
            for request_id in finished_ids
        ]

    # ----- the loop ------------------------------------------------------------------------

    def step(self) -> list[EngineCoreOutput]:
        """Schedule and launch one step; return the outputs of the step before it (overlapped
        scheduling) or of this one (synchronous). See overlap.py for when a step is synchronous and
        split_launch.py for steps whose sampling waits for the host to read the step before."""
        started = time.perf_counter()
        if self.thread_governor is not None:
            self.thread_governor.maybe_adjust()
        structured = self.structured_outputs
        outputs = self._admit_compiled_requests() if structured is not None else []
        self._release_finished(outputs)
        scheduler_output = self.scheduler.schedule()
        self.runner.release(scheduler_output.preempted_request_ids)
        if not scheduler_output.scheduled_requests:
            if self._in_flight is not None:
                return outputs + self._finish_in_flight()
            if structured is not None and structured.num_waiting and not outputs:
                structured.wait_for_compile(GRAMMAR_WAIT_S)
            return outputs
        num_prefill = scheduler_output.num_prefill_tokens
        num_decode = scheduler_output.num_decode_tokens
        # The block-table diff: only requests that got blocks this step have an entry.
        new_block_ids = scheduler_output.new_block_ids
        block_updates = [
            new_block_ids.get(r.request_id) for r in scheduler_output.scheduled_requests
        ]
        # A request that breaks the step ends alone (finish_reason "error"); the rest go on.
        previous, self._in_flight = self._in_flight, None
        graph_steps_before = self.runner.num_graph_steps
        fill = structured.start_fill if structured is not None else None
        split = None
        if previous is not None and self.overlap.needs_split_launch():
            # Some row samples from host tokens: read the previous step under this forward pass.
            execute = split = SplitLaunch(
                self.runner, functools.partial(self._process, previous), fill
            )
        else:
            execute = functools.partial(self.runner.execute, fill_grammar_bitmask=fill)
        launched, fault_outputs = execute_isolating_faults(
            execute, self.scheduler, scheduler_output, block_updates
        )
        launch_seconds = time.perf_counter() - started
        previous_step = previous.scheduler_output if previous is not None else None
        if split is not None:
            outputs += split.read_previous()
            previous = None
        self._release_finished(fault_outputs)
        outputs += fault_outputs
        if launched is not None:
            self._in_flight = InFlightStep(scheduler_output, launched)
        if previous is not None:
            # The device runs this step meanwhile: read the one before it.
            outputs += self._process(previous)
        if self._in_flight is not None and not self.overlap.enabled:
            outputs += self._finish_in_flight()
        seconds = time.perf_counter() - started
        self.step_meter.record(num_prefill, num_decode, seconds)
        if self.slow_step_s is not None and seconds > self.slow_step_s:
            graphed = self.runner.num_graph_steps > graph_steps_before
            log_slow_step(seconds, launch_seconds, graphed, scheduler_output, previous_step)
        if self.scheduler.prefill_budget is not None:
            self.scheduler.prefill_budget.observe(num_prefill + num_decode, seconds)
        return outputs

    def _finish_in_flight(self) -> list[EngineCoreOutput]:
        in_flight, self._in_flight = self._in_flight, None
        return self._process(in_flight) if in_flight is not None else []

    def _process(self, in_flight: InFlightStep) -> list[EngineCoreOutput]:
        """Wait for a launched step's sampled ids and hand them to the scheduler."""
        scheduler_output = in_flight.scheduler_output
        runner_output = in_flight.launched.result()
        structured = self.structured_outputs
        if structured is not None:
            # Fault isolation dropped any culprit from scheduled_requests, so these line up.
            structured.accept_tokens(
                scheduler_output.scheduled_requests, runner_output.sampled_token_ids
            )
        self.prompt_logprobs.add(runner_output.prompt_logprobs)
        outputs = self.scheduler.update_from_output(
            scheduler_output, runner_output.sampled_token_ids, runner_output.logprobs
        )
        self.prompt_logprobs.attach(outputs)
        self._release_finished(outputs)
        return outputs

    def _release_finished(self, outputs: list[EngineCoreOutput]) -> None:
        finished_ids = [output.request_id for output in outputs if output.finished]
        if finished_ids:
            self._forget(finished_ids)

    def _forget(self, request_ids: list[str]) -> list[str]:
        """Drop what the engine keeps per request outside the scheduler: the runner's slot, the
        overlap policy's entry, pending prompt logprobs and the grammar. Returns the ids that
        were still waiting for their grammar compile (never handed to the scheduler)."""
        self.runner.release(request_ids)
        self.overlap.forget(request_ids)
        self.prompt_logprobs.discard(request_ids)
        if self.structured_outputs is None:
            return []
        return self.structured_outputs.remove(request_ids)

    def _admit_compiled_requests(self) -> list[EngineCoreOutput]:
        """Hand requests whose grammar is compiled to the scheduler; end those that failed."""
        assert self.structured_outputs is not None
        ready, failed = self.structured_outputs.take_ready()
        for request in ready:
            self.overlap.track(request)
            self.scheduler.add_request(request)
        return [
            EngineCoreOutput(request_id=request.request_id, new_token_ids=[], finish_reason="error")
            for request, _ in failed
        ]

    def has_unfinished_requests(self) -> bool:
        waiting_for_grammar = self.structured_outputs is not None and (
            self.structured_outputs.num_waiting > 0
        )
        return (
            self.scheduler.has_unfinished_requests()
            or waiting_for_grammar
            or self._in_flight is not None
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
            num_graph_steps=self.runner.num_graph_steps,
            num_eager_steps=self.runner.num_eager_steps,
        )
