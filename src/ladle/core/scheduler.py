"""The scheduler: one token budget per step, running requests first, then waiting ones.

There are no prefill and decode phases. Each request's num_computed_tokens catches up with its
num_tokens; a step grants each request some tokens of the budget. A long prompt takes several
steps (chunked prefill) while the running requests keep decoding beside it; a prefix-cache hit
simply starts num_computed_tokens further on. When the KV pool says no, the scheduler preempts
(lowest priority, then newest) and the victim is later recomputed, reusing its cached blocks.

With a host tier (core/host_tier.py), a waiting request whose prefix continues on the host is
loaded (a KV operation in the plan) in WAITING_FOR_KV, outside the batch, and waits again once
the copy is done, its prefix now a device hit. A victim is swapped (its full blocks come back
from the host) or recomputed, per victim by cost (preemption_cost.py).
"""

from __future__ import annotations

import time

from ladle.config import CacheConfig, SchedulerConfig
from ladle.core.draft_proposer import (
    AdaptiveDraftProposer,
    DraftProposer,
    WorkerDraftProposer,
    implements,
    num_lookahead_tokens,
    propose_drafts,
)
from ladle.core.drafts_in_flight import (
    device_drafts,
    may_plan_in_flight,
    num_known_worst_case,
    waits_for_its_step,
)
from ladle.core.kv_cache_manager import KVCacheManager
from ladle.core.kv_handoff import HeldHandoffs, RemotePulls
from ladle.core.micro_batches import MicroBatches
from ladle.core.preemption_cost import PreemptionPolicy
from ladle.core.prefill_budget import ItlPrefillBudget
from ladle.core.request import Request, RequestStatus
from ladle.core.step_grants import StepGrants
from ladle.core.waiting_queue import WaitingQueue
from ladle.protocol.messages import EngineCoreOutput, SchedulerStats
from ladle.protocol.step import BlockUpdate, StepPlan, StepResult


class Scheduler:
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        kv_cache_manager: KVCacheManager,
        max_model_len: int,
        proposer: DraftProposer | None = None,
        preemption: PreemptionPolicy | None = None,
        num_micro_batches: int = 1,
    ) -> None:
        self.config = scheduler_config
        self.block_size = cache_config.block_size
        self.kv_cache_manager = kv_cache_manager
        self.max_model_len = max_model_len
        # Proposes draft tokens for running decodes (speculative decoding); None: one token a
        # step. drafts_on_device (set by the engine): drafted requests are planned while their
        # step is in flight, with drafts the worker makes (drafts_in_flight.py).
        self.proposer = proposer
        # Pipeline parallelism's steps in flight at once (micro_batches.py); None: one.
        self.micro_batches = MicroBatches(num_micro_batches) if num_micro_batches > 1 else None
        self.drafts_on_device = False
        self.requests: dict[str, Request] = {}
        self.waiting = WaitingQueue()
        self.running: list[Request] = []
        # Requests whose prefix is being loaded from the host tier (WAITING_FOR_KV).
        self.waiting_for_kv: dict[str, Request] = {}
        self.num_preemptions = 0
        self.num_swapped_preemptions = 0  # of num_preemptions, those that chose swap
        self.preemption = preemption or PreemptionPolicy(block_size=self.block_size)
        # Requests the workers hold state for (sent in full once), and those that ended since
        # the last plan: the next plan tells the workers to forget them.
        self._on_workers: set[str] = set()
        self._finished_on_workers: list[str] = []
        # Under an ITL SLO, how many prompt tokens a step may take beside running decodes.
        self.prefill_budget: ItlPrefillBudget | None = None
        # Disaggregation: a producer's handed-off blocks, a consumer's pulls (kv_handoff.py).
        kv_transfer = cache_config.kv_transfer
        self.handoffs: HeldHandoffs | None = None
        if kv_transfer is not None and kv_transfer.is_producer:
            self.handoffs = HeldHandoffs(kv_cache_manager.block_pool, kv_transfer.hold_timeout_s)
        self.pulls = RemotePulls()
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
            elif request.status == RequestStatus.WAITING_FOR_KV:
                # Its load may still be running: the workers' ordering (KVOperation) keeps the
                # freed blocks from being rewritten under it.
                del self.waiting_for_kv[request_id]
                if request.remote_prefill is not None:
                    self.pulls.cancel(request_id)
                else:
                    self.kv_cache_manager.cancel_load(request)
            else:
                self.waiting.discard(request)
            request.status = status
            self._release(request)
            finished.append(request)
        return finished

    # ----- scheduling ----------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        grants = StepGrants()
        token_budget = self.config.max_num_batched_tokens
        prefill_budget = self._prefill_allowance()
        now = time.monotonic()
        adaptive = self._adaptive_proposer()
        # Whether any request may get drafts in this step: not while the governor has
        # speculation off. Then a request with no drafts in flight skips the proposer's
        # per-request questions: at 256 running they were ~0.5 ms of a step's host time.
        drafting = self.proposer is not None
        # Lookahead KV slots are only for a worker network's drafts: asked once a step.
        worker_drafts = implements(self.proposer, WorkerDraftProposer) and bool(
            self.proposer.drafts_in_worker
        )
        if adaptive is not None:
            # More prompt tokens waiting than one step computes: a drafted step's verify
            # tokens would come out of their budget (spec_decode/governor.py).
            backlog = bool(self.waiting) and self.waiting.has_more_prompt_tokens_than(
                self.config.max_num_batched_tokens
            )
            drafting = adaptive.begin_step(len(self.running), backlog)
        if self.micro_batches is not None:
            self.micro_batches.begin_step(self.running)

        # Running requests first, in order; preemption victims come from the back.
        index = 0
        num_ending = 0  # running requests that end by length as soon as their token is read
        while index < len(self.running) and token_budget > 0:
            request = self.running[index]
            plain = not drafting and not request.num_unverified_drafts
            in_flight_drafts = (
                not plain
                and self.drafts_on_device
                and self.proposer is not None
                and may_plan_in_flight(request)
            )
            if (
                not plain
                and not in_flight_drafts
                and waits_for_its_step(request, self.proposer, adaptive)
            ):
                index += 1
                continue
            num_known_tokens = num_known_worst_case(request)
            if request.num_pending_tokens and self._ends_by_length(request):
                # Its unread token ends it: a step for it would be thrown away, and its place
                # goes to a waiting request now, as it would once the token is read.
                num_ending += 1
                index += 1
                continue
            if self.micro_batches is not None and not self.micro_batches.admits(request):
                index += 1  # its token is in flight, or the other micro-batches take it
                continue
            num_new_tokens = min(num_known_tokens - request.num_computed_tokens, token_budget)
            num_new_tokens = min(num_new_tokens, self.max_model_len - request.num_computed_tokens)
            takes_prefill = request.num_computed_tokens < num_known_tokens - 1
            if takes_prefill:
                num_new_tokens = min(num_new_tokens, prefill_budget)
            if num_new_tokens <= 0:
                index += 1
                continue
            if takes_prefill or plain:
                drafts = []
            elif in_flight_drafts:
                drafts = device_drafts(self.proposer, request, token_budget, self.max_model_len)
            else:
                drafts = propose_drafts(self.proposer, request, token_budget, self.max_model_len)
            lookahead = 0
            if worker_drafts:
                lookahead = num_lookahead_tokens(
                    self.proposer, request, num_new_tokens, len(drafts), self.max_model_len
                )
            num_new_tokens += len(drafts)
            while True:
                new_blocks = self.kv_cache_manager.allocate_slots(
                    request, num_new_tokens + lookahead
                )
                if new_blocks is not None:
                    if request.request_id not in self._on_workers:
                        self._record_new_blocks(grants, request, None)  # pulled: all of it
                    elif new_blocks:
                        self._record_new_blocks(grants, request, len(new_blocks))
                    scheduled = True
                    break
                victim = self._pick_preemption_victim()
                token_budget += grants.take_back(victim)
                if self.running.index(victim) < index:
                    index -= 1  # removing it shifts this request one place forward
                    if victim.num_pending_tokens and self._ends_by_length(victim):
                        num_ending -= 1  # counted above; no longer running
                self._preempt(victim)
                grants.preempted_request_ids.append(victim.request_id)
                if victim is request:
                    scheduled = False
                    break
            if not scheduled:
                continue  # this request left running; the same index now holds the next one
            grants.add(request, num_new_tokens)
            if drafts:
                grants.draft_token_ids[request.request_id] = drafts
            if lookahead:
                grants.num_lookahead_tokens[request.request_id] = lookahead
            token_budget -= num_new_tokens
            if takes_prefill:
                prefill_budget -= num_new_tokens
            index += 1

        # Then waiting requests, unless this step had to preempt. One loading its prefix holds
        # a seat: loads that could not run next would fill the pool with blocks evicted unused.
        while (
            not grants.preempted_request_ids
            and token_budget > 0
            and prefill_budget > 0
            and len(self.running) + len(self.waiting_for_kv) - num_ending
            < self.config.max_num_seqs
        ):
            request = self.waiting.peek()
            if request is None or request.num_pending_tokens:
                break  # a request preempted while its last step runs resumes once it is read
            computed_blocks, num_hit_tokens = self.kv_cache_manager.get_computed_blocks(request)
            if request.remote_prefill is not None and not request.remote_prefill.may_pull(now):
                request.remote_prefill = None  # too late to pull: it computes its prompt here
                self.pulls.num_too_late += 1
            if request.remote_prefill is not None:
                if not self._starts_pull(request, computed_blocks, num_hit_tokens, now):
                    break  # no room for its prompt's blocks yet
                continue
            if self._starts_load(request, computed_blocks):
                continue  # it waits outside the batch; the next waiting request may run
            num_new_tokens = request.num_tokens - num_hit_tokens
            # Without chunked prefill a prompt waits for a step with room for all of it, unless
            # no step ever could (a resumed request's prompt + outputs): then it is chunked.
            if (
                not self.config.enable_chunked_prefill
                and token_budget < num_new_tokens <= self.config.max_num_batched_tokens
            ):
                break
            num_new_tokens = min(num_new_tokens, token_budget, prefill_budget)
            lookahead = 0
            if worker_drafts:
                lookahead = num_lookahead_tokens(
                    self.proposer, request, num_new_tokens, 0, self.max_model_len, num_hit_tokens
                )
            new_blocks = self.kv_cache_manager.allocate_slots(
                request, num_new_tokens + lookahead, computed_blocks, num_hit_tokens
            )
            if new_blocks is None:
                break
            self.waiting.pop()
            request.may_load_from_host = True
            self._record_new_blocks(grants, request, None)
            request.num_computed_tokens = num_hit_tokens
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = num_hit_tokens
            if request.timings.first_scheduled_time is None:
                request.timings.first_scheduled_time = now
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            grants.add(request, num_new_tokens)
            if lookahead:
                grants.num_lookahead_tokens[request.request_id] = lookahead
            token_budget -= num_new_tokens
            prefill_budget -= num_new_tokens
        return self._plan(grants)

    def _starts_load(self, request: Request, device_hits: list) -> bool:
        """Start loading the request's prefix from the host tier when it continues there after
        the device hits; the request leaves the waiting queue for WAITING_FOR_KV. False (it is
        scheduled as usual) on no host hit, or when the pool lacks the blocks to load into."""
        manager = self.kv_cache_manager
        if not manager.has_host_tier or not request.may_load_from_host:
            return False
        host_hits = manager.find_host_hits(request, len(device_hits))
        if not host_hits or not manager.start_load(request, device_hits, host_hits):
            return False
        self.waiting.pop()
        request.status = RequestStatus.WAITING_FOR_KV
        self.waiting_for_kv[request.request_id] = request
        return True

    def _starts_pull(self, request: Request, hits: list, num_hit_tokens: int, now: float) -> bool:
        """A consumer's request: take its prefix hits and fresh blocks for the rest of its
        prompt, and pull only those blocks from the producer (kv_handoff.py). False, changing
        nothing, when the pool lacks the blocks."""
        manager = self.kv_cache_manager
        num_new = request.num_prompt_tokens - num_hit_tokens
        if manager.allocate_slots(request, num_new, hits, num_hit_tokens) is None:
            return False
        self.waiting.pop()
        request.num_cached_tokens = num_hit_tokens
        request.timings.first_scheduled_time = now
        remote = request.remote_prefill
        first = num_hit_tokens // self.block_size
        targets = manager.get_block_ids_from(request.request_id, first)
        request.status = RequestStatus.WAITING_FOR_KV
        self.waiting_for_kv[request.request_id] = request
        if targets:
            self.pulls.start(request.request_id, remote.peer, remote.block_ids[first:], targets)
        else:
            self._pulled(request)  # every block of its prompt was a hit here
        return True

    def _pulled(self, request: Request) -> None:
        """Its prompt's KV is in place: it runs from its first token on (it decodes)."""
        del self.waiting_for_kv[request.request_id]
        request.remote_prefill = None
        request.num_computed_tokens = request.num_prompt_tokens
        self.kv_cache_manager.cache_computed_blocks(request)
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def _record_new_blocks(self, grants: StepGrants, request: Request, num_new: int | None) -> None:
        """Note the last num_new blocks of the request's table (None: all of it) as new."""
        manager = self.kv_cache_manager
        start = 0 if num_new is None else manager.num_blocks_of(request.request_id) - num_new
        grants.new_blocks[request.request_id] = BlockUpdate(
            start, manager.get_block_ids_from(request.request_id, start)
        )

    def _ends_by_length(self, request: Request) -> bool:
        """Whether the request ends by length once its pending tokens are read."""
        num_outputs = request.num_output_tokens + request.num_pending_tokens
        num_known = request.num_tokens + request.num_pending_tokens
        return num_outputs >= request.max_tokens or num_known >= self.max_model_len

    def _plan(self, grants: StepGrants) -> StepPlan:
        """The plan of the granted step. Counts its tokens as computed now and its samples as
        pending, so the next schedule can run before this step's results are read."""
        plan = StepPlan(
            preempted_request_ids=grants.preempted_request_ids,
            finished_request_ids=self._finished_on_workers,
            kv_operations=self.kv_cache_manager.take_kv_operations()
            + self.pulls.take_operations(),
        )
        self._finished_on_workers = []
        grants.fill_plan(plan, self._on_workers)
        return plan

    def _prefill_allowance(self) -> int:
        """Prompt tokens this step may take: all of the budget unless an ITL SLO limits it."""
        if self.prefill_budget is None:
            return self.config.max_num_batched_tokens
        num_decodes = sum(
            1
            for r in self.running
            if r.num_computed_tokens >= r.num_tokens + r.num_pending_tokens - 1
        )
        return self.prefill_budget.budget(num_decodes)

    def _pick_preemption_victim(self) -> Request:
        """Lowest priority first (largest value), then the newest arrival."""
        return max(self.running, key=lambda r: (r.priority, r.arrival_time))

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        manager = self.kv_cache_manager
        if manager.has_host_tier:
            # Swap or recompute, decided now by cost (its freed blocks are written back as they
            # near eviction; those on the host already cost no copy out).
            swaps = self.preemption.swaps(
                request.num_computed_tokens, self._num_blocks_on_host(request)
            )
            request.may_load_from_host = swaps
            self.num_swapped_preemptions += swaps
        # Only a swapping victim's blocks are written back (a recomputing one has no use for
        # them); the workers forget it (the plan names it) and get it in full when it resumes.
        manager.free(request, write_back=request.may_load_from_host)
        self._on_workers.discard(request.request_id)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.push(request)

    def _num_blocks_on_host(self, request: Request) -> int:
        host_tier = self.kv_cache_manager.host_tier
        assert host_tier is not None
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_hashes))
        return sum(1 for h in request.block_hashes[:num_full] if host_tier.contains(h))

    # ----- results -------------------------------------------------------------------------

    def settle_kv_operations(self, done: list[int], failed: dict[int, str]) -> None:
        """Settle the copies a step reports (with its result, or at its launch: settling twice
        is harmless, known ids are settled once): a request whose load is done (or failed)
        waits again, at its old place in the queue; after a failure it recomputes."""
        if not (done or failed):
            return
        finished = self.kv_cache_manager.finish_transfers(done, failed)
        pulls = self.pulls.finish(done, failed)
        for request_id in pulls.pulled:
            self._pulled(self.waiting_for_kv[request_id])
        for request_id in pulls.failed:
            # The producer's KV is out of reach: compute the prompt here (the same tokens).
            request = self.waiting_for_kv.pop(request_id)
            request.remote_prefill = None
            self.kv_cache_manager.free(request)
            request.status = RequestStatus.WAITING
            self.waiting.readmit(request)
        for request_id in [*finished.loaded, *finished.failed]:
            request = self.waiting_for_kv.pop(request_id, None)
            if request is None:
                continue
            # Loaded: its blocks are device hits now. Failed: the host copy is gone.
            request.may_load_from_host = False
            request.status = (
                RequestStatus.PREEMPTED if request.num_preemptions else RequestStatus.WAITING
            )
            self.waiting.readmit(request)

    def update_from_output(self, plan: StepPlan, result: StepResult) -> list[EngineCoreOutput]:
        """Append each sampling request's accepted tokens and end finished requests.

        result.token_ids holds, per scheduled request, the tokens the step accepted (none for a
        prompt chunk short of the prompt's end). A step that verified k drafts and accepted
        fewer rolls the request's computed count back over the rejected ones and frees the
        blocks only they used. EOS, a stop token id, max_tokens or the model length met inside
        a multi-token result ends the request at that token; the tokens after it are dropped.

        With overlapped scheduling the next step is already scheduled (and running) when this
        is called: a request this step ends may be in it, and its token there is never read; a
        request preempted since is in the waiting queue and still takes its token."""
        outputs = []
        now = time.monotonic()
        self.settle_kv_operations(result.kv_operations_done, result.kv_operations_failed)
        for position, scheduled in enumerate(plan.scheduled):
            request = self.requests.get(scheduled.request_id)
            if request is None:
                continue  # ended (aborted, stopped, failed) while this step ran
            if not scheduled.samples:
                self.kv_cache_manager.cache_computed_blocks(request)
                continue  # a prompt chunk that did not reach the end of the prompt
            request.num_pending_tokens -= 1
            request.num_unverified_drafts -= len(scheduled.draft_token_ids)
            token_ids = result.token_ids[position]
            if not token_ids:
                continue  # left out of the step (it failed): the engine ends it
            num_rejected = len(scheduled.draft_token_ids) - (len(token_ids) - 1)
            if scheduled.draft_token_ids:
                adaptive = self._adaptive_proposer()
                if adaptive is not None:
                    adaptive.observe(
                        request.request_id, len(scheduled.draft_token_ids), len(token_ids) - 1
                    )
            if num_rejected > 0 and request.status == RequestStatus.RUNNING:
                request.num_computed_tokens -= num_rejected
            accepted: list[int] = []
            finish_status = None
            for token_id in token_ids:
                request.append_output_token(token_id)
                accepted.append(token_id)
                finish_status = self._check_stop(request, token_id)
                if finish_status is not None:
                    break
            if request.timings.first_token_time is None:
                request.timings.first_token_time = now
            if num_rejected > 0 and request.status == RequestStatus.RUNNING:
                # Blocks of only rejected drafts go back; kept: room for num_tokens, and for a
                # step in flight (planned for the worst case, drafts_in_flight.py) its computed.
                self.kv_cache_manager.trim(
                    request, max(request.num_tokens, request.num_computed_tokens)
                )
            model_drafts = result.draft_token_ids.get(request.request_id)
            if model_drafts and finish_status is None:
                self._store_model_drafts(request, model_drafts)
            # Before any release: a finished request's full blocks stay cached for others.
            self.kv_cache_manager.cache_computed_blocks(request)
            if finish_status is None and request.remote_decode:
                finish_status = self._hand_off(request)
            if finish_status is not None:
                if request.status == RequestStatus.RUNNING:
                    self.running.remove(request)
                else:
                    self.waiting.discard(request)  # preempted while this step ran
                request.status = finish_status
                self._release(request)
            logprobs = result.logprobs[position] if result.logprobs else None
            outputs.append(
                EngineCoreOutput(
                    request_id=request.request_id,
                    new_token_ids=accepted,
                    new_logprobs=logprobs[: len(accepted)] if logprobs else None,
                    finish_reason=request.status.finish_reason,
                    stop_reason=request.stop_reason,
                    num_cached_tokens=max(request.num_cached_tokens, 0),
                    first_scheduled_time=request.timings.first_scheduled_time,
                    first_token_time=request.timings.first_token_time,
                )
            )
        return outputs

    def _hand_off(self, request: Request) -> RequestStatus | None:
        """A producer's request after its first token: hold its blocks for the consumer."""
        if request.status != RequestStatus.RUNNING or self.handoffs is None:
            # Preempted while its step ran: nothing to hand over; it runs to its end here (the
            # API process passes its outputs through).
            request.remote_decode = False
            return None
        blocks = self.kv_cache_manager.detach(request)
        self.handoffs.hold(request.request_id, blocks, request.sampling_seed)
        return RequestStatus.FINISHED_REMOTE_DECODE

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

    def _store_model_drafts(self, request: Request, draft_token_ids: list[int]) -> None:
        proposer = self.proposer
        if implements(proposer, WorkerDraftProposer):
            proposer.store_model_drafts(request, draft_token_ids)

    def _adaptive_proposer(self) -> AdaptiveDraftProposer | None:
        proposer = self.proposer
        return proposer if implements(proposer, AdaptiveDraftProposer) else None

    def _release(self, request: Request) -> None:
        adaptive = self._adaptive_proposer()
        if adaptive is not None:
            adaptive.release(request)
        self.kv_cache_manager.free(request)
        request.timings.finished_time = time.monotonic()
        del self.requests[request.request_id]
        if request.request_id in self._on_workers:
            self._on_workers.discard(request.request_id)
            self._finished_on_workers.append(request.request_id)

    # ----- introspection -------------------------------------------------------------------

    def has_unfinished_requests(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0 or bool(self.waiting_for_kv)

    @property
    def has_kv_transfers(self) -> bool:
        """Copies to or from the host tier not settled yet: the next plan, even an empty one,
        issues or settles them (until then their blocks stay pinned)."""
        transfers = self.kv_cache_manager.transfers
        return transfers is not None and transfers.num_in_flight > 0

    @property
    def has_requests_to_forget(self) -> bool:
        """Ended requests the workers still hold: the next plan, even an empty one, frees them."""
        return bool(self._finished_on_workers)

    def get_stats(self) -> SchedulerStats:
        manager = self.kv_cache_manager
        host_tier = manager.host_tier
        transfers = manager.transfers
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting) + len(self.waiting_for_kv),
            kv_cache_usage=manager.usage,
            num_free_blocks=manager.num_free_blocks,
            num_total_blocks=manager.block_pool.num_usable_blocks,
            prefix_cache_queries=manager.prefix_cache_queries,
            prefix_cache_hits=manager.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
            num_swapped_preemptions=self.num_swapped_preemptions,
            num_waiting_for_kv=len(self.waiting_for_kv),
            host_cache_queries=manager.host_cache_queries,
            host_cache_hits=manager.host_cache_hits,
            num_host_blocks=host_tier.num_blocks if host_tier is not None else 0,
            num_host_cached_blocks=host_tier.num_used_blocks if host_tier is not None else 0,
            host_kv_usage=manager.host_usage,
            num_host_stores_dropped=transfers.counts.num_stores_dropped if transfers else 0,
            num_host_blocks_stored_at_eviction=(
                transfers.counts.num_blocks_stored_at_eviction if transfers else 0
            ),
        )

