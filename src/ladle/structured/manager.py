"""The engine core's structured-output side: requests waiting on a grammar, the batch bitmask,
and advancing each constrained request's matcher by its sampled token.

A request whose grammar is compiling is held here, not in the scheduler, so the running batch
never waits for it; once the compile is done the engine hands it to the scheduler. Per step,
`fill_bitmask` runs on the CPU while the device computes the forward pass (the model runner calls
it after launching the forward): llguidance fills the constrained rows' masks on its own threads
into one pinned buffer that also carries the row indices, and one non-blocking copy takes it to
the device, where `apply_token_bitmask` uses it in one launch.
"""

from __future__ import annotations

import concurrent.futures
import logging
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ladle.structured.bitmask import bitmask_width
from ladle.structured.grammar import GrammarCompiler, RequestGrammar

if TYPE_CHECKING:
    from ladle.core.request import Request

logger = logging.getLogger(__name__)


@dataclass
class GrammarBitmask:
    """One step's allowed-token masks, on the logits' device."""

    bitmask: torch.Tensor  # [num_constrained, words] int32
    row_indices: torch.Tensor  # [num_constrained] int32: rows of the sampling batch


class StructuredOutputManager:
    def __init__(self, compiler: GrammarCompiler, device: torch.device) -> None:
        self.compiler = compiler
        self.device = device
        self.width = bitmask_width(compiler.vocab_size)
        self._waiting: dict[str, tuple[Request, Future]] = {}
        self._grammars: dict[str, RequestGrammar] = {}
        self._executor = None
        self._host_buffer = torch.empty(0, dtype=torch.int32)
        # The last copy out of the pinned buffer; refilling waits for it (a no-op while the
        # step syncs on its sampled ids, needed once steps overlap).
        self._copy_done: torch.cuda.Event | None = None

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
        self._grammars[request.request_id] = RequestGrammar(
            future.result().deep_copy(), params.reasoning_end_token_ids
        )
        # A resumed or recomputed request must not replay tokens it never had: fresh requests
        # have none, so nothing to consume here.

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
            if self._waiting.pop(request_id, None) is not None:
                was_waiting.append(request_id)
        return was_waiting

    # ----- per step ------------------------------------------------------------------------

    def fill_bitmask(self, sampling_requests: list[Request]) -> GrammarBitmask | None:
        """The masks of the constrained rows among this step's sampling rows, or None when no
        row is constrained (the unconstrained batch pays nothing)."""
        if not self._grammars:
            return None
        rows = []
        for row, request in enumerate(sampling_requests):
            grammar = self._grammars.get(request.request_id)
            if grammar is not None and grammar.needs_mask:
                rows.append((row, grammar))
        if not rows:
            return None
        import llguidance
        import llguidance.torch

        if self._copy_done is not None:
            self._copy_done.synchronize()
        num_rows = len(rows)
        size = num_rows * (self.width + 1)
        if self._host_buffer.numel() < size:
            self._host_buffer = torch.empty(
                max(size, 2 * self._host_buffer.numel()),
                dtype=torch.int32,
                pin_memory=self.device.type == "cuda",
            )
        # Masks first, then the row indices, so one copy carries both.
        packed = self._host_buffer[:size]
        masks = packed[: num_rows * self.width].view(num_rows, self.width)
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        llguidance.torch.fill_next_token_bitmask_par(
            self._executor,
            [(grammar.matcher, index) for index, (_, grammar) in enumerate(rows)],
            masks,
        )
        packed[num_rows * self.width :] = torch.tensor([row for row, _ in rows], dtype=torch.int32)
        on_device = packed.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            self._copy_done = torch.cuda.Event()
            self._copy_done.record()
        return GrammarBitmask(
            bitmask=on_device[: num_rows * self.width].view(num_rows, self.width),
            row_indices=on_device[num_rows * self.width :],
        )

    def accept_tokens(self, requests: list[Request], token_ids: list[int]) -> None:
        """Advance each constrained request's matcher by the token it sampled (-1: none)."""
        if not self._grammars:
            return
        for request, token_id in zip(requests, token_ids):
            grammar = self._grammars.get(request.request_id)
            if grammar is not None and token_id >= 0:
                grammar.accept(token_id)

    def grammar_of(self, request_id: str) -> RequestGrammar | None:
        return self._grammars.get(request_id)
