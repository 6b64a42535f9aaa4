"""The engine core's structured-output side: requests waiting on a grammar, the batch bitmask,
and advancing each constrained request's matcher by its sampled token.

A request whose grammar is compiling is held here, not in the scheduler, so the running batch
never waits for it; once the compile is done the engine hands it to the scheduler.

Per step, nothing of the grammar work sits between two forward passes:
- `accept_tokens` only notes each constrained request's sampled token (a dict append);
- `start_fill`, called by the model runner just before it launches the forward pass, hands one
  job to a worker thread: advance every matcher by its noted tokens (llguidance's batched
  `consume_token_par`), then fill the constrained rows' masks (`fill_next_token_bitmask_par`)
  into one pinned buffer that also carries the row indices. llguidance drops the GIL for both,
  so the engine thread keeps launching kernels (or, on the CPU, computing) meanwhile;
- `PendingGrammarBitmask.wait`, called once the logits exist, joins the job and makes one
  non-blocking copy to the device, where `apply_token_bitmask` uses it in one launch.
A batch without constrained rows starts no job and pays nothing.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ladle.structured.bitmask import bitmask_width
from ladle.structured.grammar import GrammarCompiler, RequestGrammar

if TYPE_CHECKING:
    import llguidance

    from ladle.core.request import Request

logger = logging.getLogger(__name__)


# llguidance's pool defaults to 80% of the cores; a few threads fill 16-64 masks in tens of
# microseconds and leave the rest of the machine to the engine thread and torch.
MAX_GRAMMAR_THREADS = 8


@dataclass
class GrammarBitmask:
    """One step's allowed-token masks, on the logits' device."""

    bitmask: torch.Tensor  # [num_constrained, words] int32
    row_indices: torch.Tensor  # [num_constrained] int32: rows of the sampling batch


class PendingGrammarBitmask:
    """A step's masks being filled on the worker thread; `wait` gives them on the device."""

    def __init__(self, manager: StructuredOutputManager, job: Future) -> None:
        self._manager = manager
        self._job = job

    def wait(self) -> GrammarBitmask | None:
        """The masks (None if, once advanced, no row needs one), copied to the device."""
        packed, num_rows = self._job.result()
        if num_rows == 0:
            return None
        return self._manager._to_device(packed, num_rows)


class StructuredOutputManager:
    def __init__(self, compiler: GrammarCompiler, device: torch.device) -> None:
        self.compiler = compiler
        self.device = device
        self.width = bitmask_width(compiler.vocab_size)
        self._waiting: dict[str, tuple[Request, Future]] = {}
        self._grammars: dict[str, RequestGrammar] = {}
        self._executor: llguidance.LLExecutor | None = None
        # One worker: its jobs (advance, then fill) run in step order.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ladle-grammar-mask")
        self._in_flight: Future | None = None
        # Sampled tokens not yet consumed by their request's matcher (the next job does it).
        self._pending: dict[str, tuple[RequestGrammar, list[int]]] = {}
        self._host_buffer = torch.empty(0, dtype=torch.int32)
        # The last copy out of the pinned buffer; refilling waits for it (a no-op while the
        # step syncs on its sampled ids, needed once steps overlap).
        self._copy_done: torch.cuda.Event | None = None
        self._copy_stream: torch.cuda.Stream | None = None

    # ----- admission -----------------------------------------------------------------------

    def add_request(self, request: Request) -> bool:
        """Start the request's grammar; True if it is ready now (cached), else it waits here."""
        params = request.sampling_params.structured_outputs
        assert params is not None
        future = self.compiler.submit(params.to_grammar())
        if future.done() and future.exception() is None:
            self._attach(request, future)
            return True
        self._waiting[request.request_id] = (request, future)
        return False

    def _attach(self, request: Request, future: Future) -> None:
        params = request.sampling_params.structured_outputs
        assert params is not None
        grammar = self._grammars[request.request_id] = RequestGrammar(
            future.result().deep_copy(), params.reasoning_end_token_ids
        )
        # A fresh request has no outputs yet. A disaggregated consumer's request arrives with
        # the producer's first token, which its grammar consumes now (a resumed request keeps
        # its grammar and is never attached again).
        for token_id in request.output_token_ids:
            grammar.accept(token_id)

    def take_ready(self) -> tuple[list[Request], list[tuple[Request, str]]]:
        """Requests whose grammar finished compiling: (ready, [(failed, reason)])."""
        ready, failed = [], []
        for request_id, (request, future) in list(self._waiting.items()):
            if not future.done():
                continue
            del self._waiting[request_id]
            error = future.exception()
            if error is None:
                self._attach(request, future)
                ready.append(request)
            else:
                failed.append((request, str(error)))
        return ready, failed

    def wait_for_compile(self, timeout_s: float) -> None:
        """Block up to timeout_s until some waiting grammar is compiled (an idle engine)."""
        futures = [future for _, future in self._waiting.values()]
        if futures:
            concurrent.futures.wait(futures, timeout_s, concurrent.futures.FIRST_COMPLETED)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def remove(self, request_ids: list[str]) -> list[str]:
        """Forget finished or aborted requests; returns those that were still waiting."""
        was_waiting = []
        for request_id in request_ids:
            self._grammars.pop(request_id, None)
            self._pending.pop(request_id, None)
            if self._waiting.pop(request_id, None) is not None:
                was_waiting.append(request_id)
        return was_waiting

    # ----- per step ------------------------------------------------------------------------

    def start_fill(self, rows: list[tuple[str, list[int]]]) -> PendingGrammarBitmask | None:
        """Start filling the masks of the constrained rows among this step's sampling rows on
        the worker thread; None (no job at all) when no row has a grammar. rows: per sampling
        row, (request id, the draft tokens before the row: [] but for speculative rows)."""
        if not self._grammars:
            return None
        candidates = []
        for row, (request_id, drafts) in enumerate(rows):
            grammar = self._grammars.get(request_id)
            if grammar is not None:
                candidates.append((row, grammar, drafts))
        if not candidates:
            return None
        pending, self._pending = self._pending, {}
        self._in_flight = self._worker.submit(self._advance_and_fill, pending, candidates)
        return PendingGrammarBitmask(self, self._in_flight)

    def fill_bitmask(self, rows: list[tuple[str, list[int]]]) -> GrammarBitmask | None:
        """start_fill and wait in one call: the masks, or None when no row is constrained."""
        pending = self.start_fill(rows)
        return pending.wait() if pending is not None else None

    def accept_tokens(self, request_ids: list[str], token_ids: list[list[int]]) -> None:
        """Note each constrained request's accepted tokens; the next fill job (or
        `grammar_of`) makes its matcher consume them."""
        if not self._grammars:
            return
        for request_id, accepted in zip(request_ids, token_ids):
            if not accepted:
                continue
            grammar = self._grammars.get(request_id)
            if grammar is None:
                continue
            entry = self._pending.get(request_id)
            if entry is None:
                self._pending[request_id] = (grammar, list(accepted))
            else:
                entry[1].extend(accepted)

    def grammar_of(self, request_id: str) -> RequestGrammar | None:
        """The request's grammar with every accepted token consumed (to read or roll back)."""
        self.flush()
        return self._grammars.get(request_id)

    def flush(self) -> None:
        """Wait for the job in flight, then consume every noted token now."""
        if self._in_flight is not None:
            concurrent.futures.wait([self._in_flight])
            self._in_flight = None
        pending, self._pending = self._pending, {}
        self._advance(pending)

    def shutdown(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)

    # ----- on the worker thread ------------------------------------------------------------

    def _llguidance_executor(self) -> llguidance.LLExecutor:
        if self._executor is None:
            import llguidance

            threads = min(MAX_GRAMMAR_THREADS, max(1, (os.cpu_count() or 1) - 1))
            self._executor = llguidance.LLExecutor(num_threads=threads)
        return self._executor

    def _advance(self, pending: dict[str, tuple[RequestGrammar, list[int]]]) -> None:
        """Consume the noted tokens: the k-th token of every request in the k-th batched call
        (a matcher takes its tokens in order, and only once per call)."""
        executor = self._llguidance_executor()
        queues = [(grammar, tokens) for grammar, tokens in pending.values()]
        position = 0
        while queues:
            batch = []
            for grammar, tokens in queues:
                token_id = tokens[position]
                if grammar.wants_matcher(token_id):
                    batch.append((grammar, token_id))
            if batch:
                results = executor.consume_token_par([(g.matcher, t) for g, t in batch])
                for (grammar, token_id), accepted in zip(batch, results):
                    grammar.record_consumed(token_id, accepted)
            position += 1
            queues = [(g, tokens) for g, tokens in queues if len(tokens) > position]

    def _advance_and_fill(
        self,
        pending: dict[str, tuple[RequestGrammar, list[int]]],
        candidates: list[tuple[int, RequestGrammar, list[int]]],
    ) -> tuple[torch.Tensor | None, int]:
        """The worker's job: advance, then fill the masks of the rows that need one into the
        pinned buffer (masks first, then the row indices, so one copy carries both)."""
        import llguidance.torch

        self._advance(pending)
        rows = [
            (row, grammar)
            for row, grammar, drafts in candidates
            if not drafts and grammar.needs_mask
        ]
        draft_rows = [(row, grammar, drafts) for row, grammar, drafts in candidates if drafts]
        if not rows and not draft_rows:
            return None, 0
        if not rows:
            rows = []
        if self._copy_done is not None:
            self._copy_done.synchronize()  # the last copy out of the buffer has finished
        num_rows = len(rows)
        size = num_rows * (self.width + 1)
        if self._host_buffer.numel() < size:
            self._host_buffer = torch.empty(
                max(size, 2 * self._host_buffer.numel()),
                dtype=torch.int32,
                pin_memory=self.device.type == "cuda",
            )
        packed = self._host_buffer[:size]
        masks = packed[: num_rows * self.width].view(num_rows, self.width)
        llguidance.torch.fill_next_token_bitmask_par(
            self._llguidance_executor(),
            [(grammar.matcher, index) for index, (_, grammar) in enumerate(rows)],
            masks,
        )
        row_ids = [row for row, _ in rows]
        if draft_rows:
            draft_masks, draft_row_ids = _fill_draft_rows(draft_rows, self.width)
            if draft_row_ids:
                masks = torch.cat([masks, draft_masks])
                row_ids += draft_row_ids
                num_rows = len(row_ids)
                size = num_rows * (self.width + 1)
                if self._host_buffer.numel() < size:
                    self._host_buffer = torch.empty(
                        size, dtype=torch.int32, pin_memory=self.device.type == "cuda"
                    )
                packed = self._host_buffer[:size]
                packed[: num_rows * self.width] = masks.reshape(-1)
        if not row_ids:
            return None, 0
        packed[num_rows * self.width :] = torch.tensor(row_ids, dtype=torch.int32)
        return packed, num_rows

    # ----- back on the engine thread -------------------------------------------------------

    def _to_device(self, packed: torch.Tensor, num_rows: int) -> GrammarBitmask:
        """One non-blocking copy. On CUDA it runs on a side stream, so it overlaps whatever of
        the forward pass is still queued; the compute stream waits for it only before the mask
        kernel."""
        if self.device.type != "cuda":
            on_device = packed.to(self.device)
        else:
            compute_stream = torch.cuda.current_stream(self.device)
            if self._copy_stream is None:
                self._copy_stream = torch.cuda.Stream(self.device)
            with torch.cuda.stream(self._copy_stream):
                on_device = packed.to(self.device, non_blocking=True)
                self._copy_done = torch.cuda.Event()
                self._copy_done.record()
            compute_stream.wait_event(self._copy_done)
            # Allocated on the side stream, used on the compute stream: keep the allocator from
            # reusing it before the compute stream is done with it.
            on_device.record_stream(compute_stream)
        return GrammarBitmask(
            bitmask=on_device[: num_rows * self.width].view(num_rows, self.width),
            row_indices=on_device[num_rows * self.width :],
        )


def _fill_draft_rows(
    draft_rows: list[tuple[int, RequestGrammar, list[int]]], width: int
) -> tuple[torch.Tensor, list[int]]:
    """Masks of rows that follow draft tokens: the grammar advanced over the drafts before the
    row, then rolled back. A row after a draft the grammar refuses gets no mask (that draft is
    rejected anyway: the row before it cannot sample it)."""
    import llguidance.torch

    masks, row_ids = [], []
    for row, grammar, drafts in draft_rows:
        num_accepted = 0
        refused = False
        for token_id in drafts:
            matcher = grammar.matcher
            if grammar.is_active and not (matcher.is_error() or matcher.is_stopped()):
                if matcher.validate_tokens([token_id]) != 1:
                    refused = True
                    break
            grammar.accept(token_id)
            num_accepted += 1
        if not refused and grammar.needs_mask:
            mask = torch.zeros((1, width), dtype=torch.int32)
            llguidance.torch.fill_next_token_bitmask(grammar.matcher, mask, 0)
            masks.append(mask)
            row_ids.append(row)
        grammar.rollback(num_accepted)
    if not masks:
        return torch.zeros((0, width), dtype=torch.int32), []
    return torch.cat(masks), row_ids
