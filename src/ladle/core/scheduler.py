"""The scheduler: one token budget per step, running requests first, then waiting ones.

There are no prefill and decode phases. Each request's num_computed_tokens catches up with its
num_tokens; a step grants each request some tokens of the budget. A long prompt takes several
steps (chunked prefill) while the running requests keep decoding beside it; a prefix-cache hit
simply starts num_computed_tokens further on. When the KV pool says no, the scheduler preempts
(lowest priority, then newest) and the victim is later recomputed, reusing its cached blocks.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field

from ladle.config import CacheConfig, SchedulerConfig
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.prefill_budget import ItlPrefillBudget
from ladle.core.request import Request, RequestStatus
from ladle.engine.messages import EngineCoreOutput, SchedulerStats, TokenLogprobs


@dataclass
class SchedulerOutput:
    """The work of one step, in batch order."""

    scheduled_requests: list[Request] = field(default_factory=list)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    preempted_request_ids: list[str] = field(default_factory=list)

    @property
    def total_num_scheduled_tokens(self) -> int:
        return sum(self.num_scheduled_tokens.values())

    def will_sample(self, request: Request) -> bool:
        """A request samples a token once this step computes its last known token."""
        scheduled = self.num_scheduled_tokens[request.request_id]
        return request.num_computed_tokens + scheduled >= request.num_tokens


class WaitingQueue:
    """Waiting requests ordered by (priority, arrival time); lower priority values run first.

    A heap with lazy deletion: an aborted request is only marked and skipped when it surfaces.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, float, int, Request]] = []
        self._order = itertools.count()
        self._num_live = 0

    def push(self, request: Request) -> None:
        heapq.heappush(
            self._heap, (request.priority, request.arrival_time, next(self._order), request)
        )
        self._num_live += 1

    def peek(self) -> Request | None:
        while self._heap and self._heap[0][3].is_finished:
            heapq.heappop(self._heap)
        return self._heap[0][3] if self._heap else None

    def pop(self) -> Request:
        request = self.peek()
        assert request is not None
        heapq.heappop(self._heap)
        self._num_live -= 1
        return request

    def discard(self, request: Request) -> None:
        """Called after the request was marked finished; the heap entry goes lazily."""
        self._num_live -= 1

    def __len__(self) -> int:
        return self._num_live


class Scheduler:
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        kv_cache_manager: KVCacheManager,
        max_model_len: int,
    ) -> None:
        self.config = scheduler_config
        self.block_size = cache_config.block_size
        self.kv_cache_manager = kv_cache_manager
        self.max_model_len = max_model_len
        self.requests: dict[str, Request] = {}
        self.waiting = WaitingQueue()
        self.running: list[Request] = []
        self.num_preemptions = 0
        # Under an ITL SLO, how many prompt tokens a step may take beside running decodes.
        self.prefill_budget: ItlPrefillBudget | None = None
        if scheduler_config.itl_slo_ms is not None:
            self.prefill_budget = ItlPrefillBudget(
                scheduler_config.itl_slo_ms / 1000.0, scheduler_config.max_num_batched_tokens
            )

    # ----- admission -----------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        self.requests[request.request_id] = request
        self.waiting.push(request)

    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> list[Request]:
        """Abort (or otherwise end) requests wherever they are; their blocks are freed now."""
        finished = []
        for request_id in request_ids:
            request = self.requests.get(request_id)
            if request is None or request.is_finished:
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.discard(request)
            request.status = status
            self._release(request)
            finished.append(request)
        return finished

    # ----- scheduling ----------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        output = SchedulerOutput()
        token_budget = self.config.max_num_batched_tokens
        prefill_budget = self._prefill_allowance()
        now = time.monotonic()

        # Running requests first, in order; preemption victims come from the back.
        index = 0
        while index < len(self.running) and token_budget > 0:
            request = self.running[index]
            num_new_tokens = min(request.num_tokens - request.num_computed_tokens, token_budget)
            num_new_tokens = min(num_new_tokens, self.max_model_len - request.num_computed_tokens)
            takes_prefill = request.num_computed_tokens < request.num_tokens - 1
            if takes_prefill:
                num_new_tokens = min(num_new_tokens, prefill_budget)
            if num_new_tokens <= 0:
                index += 1
                continue
            while True:
                if self.kv_cache_manager.allocate_slots(request, num_new_tokens) is not None:
                    scheduled = True
                    break
                victim = self._pick_preemption_victim()
                token_budget += output.num_scheduled_tokens.pop(victim.request_id, 0)
                if victim in output.scheduled_requests:
                    output.scheduled_requests.remove(victim)
                if self.running.index(victim) < index:
                    index -= 1  # removing it shifts this request one place forward
                self._preempt(victim)
                output.preempted_request_ids.append(victim.request_id)
                if victim is request:
                    scheduled = False
                    break
            if not scheduled:
                continue  # this request left running; the same index now holds the next one
            output.scheduled_requests.append(request)
            output.num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
            if takes_prefill:
                prefill_budget -= num_new_tokens
            index += 1

        # Then waiting requests, unless this step already had to preempt (the pool is tight).
        while (
            not output.preempted_request_ids
            and token_budget > 0
            and prefill_budget > 0
            and len(self.running) < self.config.max_num_seqs
        ):
            request = self.waiting.peek()
            if request is None:
                break
            computed_blocks, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
            num_new_tokens = request.num_tokens - num_hit_tokens
            # Without chunked prefill a prompt waits for a step with room for all of it, unless
            # no step ever could (a resumed request's prompt + outputs): then it is chunked.
            if (
                not self.config.enable_chunked_prefill
                and token_budget < num_new_tokens <= self.config.max_num_batched_tokens
            ):
                break
            num_new_tokens = min(num_new_tokens, token_budget, prefill_budget)
            new_blocks = self.kv_cache_manager.allocate_slots(
                request, num_new_tokens, computed_blocks, num_hit_tokens
            )
            if new_blocks is None:
                break
            self.waiting.pop()
            request.num_computed_tokens = num_hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens
            if request.timings.first_scheduled_time is None:
                request.timings.first_scheduled_time = now
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            output.scheduled_requests.append(request)
            output.num_scheduled_tokens[request.request_id] = num_new_tokens
            token_budget -= num_new_tokens
            prefill_budget -= num_new_tokens
        return output

    def _prefill_allowance(self) -> int:
        """Prompt tokens this step may take: all of the budget unless an ITL SLO limits it."""
        if self.prefill_budget is None:
            return self.config.max_num_batched_tokens
        num_decodes = sum(
            1 for r in self.running if r.num_computed_tokens >= r.num_tokens - 1
        )
        return self.prefill_budget.budget(num_decodes)

    def _pick_preemption_victim(self) -> Request:
        """Lowest priority first (largest value), then the newest arrival."""
        return max(self.running, key=lambda r: (r.priority, r.arrival_time))

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push(request)

    # ----- results -------------------------------------------------------------------------

    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        sampled_token_ids: list[int],
        logprobs: list[TokenLogprobs | None] | None = None,
    ) -> list[EngineCoreOutput]:
        """Advance each scheduled request by its tokens, append sampled tokens, end finished
        requests. sampled_token_ids holds one id per scheduled request (ignored for those that
        did not sample this step)."""
        outputs = []
        now = time.monotonic()
        for position, request in enumerate(scheduler_output.scheduled_requests):
            if request.is_finished:
                continue  # aborted while the step ran
            will_sample = scheduler_output.will_sample(request)
            request.num_computed_tokens += scheduler_output.num_scheduled_tokens[
                request.request_id
            ]
            self.kv_cache_manager.cache_computed_blocks(request)
            if not will_sample:
                continue  # a prompt chunk that did not reach the end of the prompt
            token_id = sampled_token_ids[position]
            request.append_output_token(token_id)
            if request.timings.first_token_time is None:
                request.timings.first_token_time = now
            finish_status = self._check_stop(request, token_id)
            if finish_status is not None:
                request.status = finish_status
                self.running.remove(request)
                self._release(request)
            outputs.append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=[token_id],
                    new_logprobs=[logprobs[position]] if logprobs and logprobs[position] else None,
                    finish_reason=request.status.finish_reason,
                    stop_reason=request.stop_reason,
                    num_cached_tokens=max(request.num_cached_tokens, 0),
                    first_scheduled_time=request.timings.first_scheduled_time,
                    first_token_time=request.timings.first_token_time,
                )
            )
        return outputs

    def _check_stop(self, request: Request, token_id: int) -> RequestStatus | None:
        params = request.sampling_params
        if request.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token_id in request.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token_id in params.stop_token_ids:
                request.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED
        if request.num_output_tokens >= request.max_tokens:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        if request.num_tokens >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH_CAPPED
        return None

    def _release(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        request.timings.finished_time = time.monotonic()
        del self.requests[request.request_id]

    # ----- introspection -------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def get_stats(self) -> SchedulerStats:
        manager = self.kv_cache_manager
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting),
            kv_cache_usage=manager.usage,
            num_free_blocks=manager.num_free_blocks,
            num_total_blocks=manager.block_pool.num_usable_blocks,
            prefix_cache_queries=manager.prefix_cache_queries,
            prefix_cache_hits=manager.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
        )
