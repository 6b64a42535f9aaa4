"""A step launched in two halves, with the step before it read in between.

A grammar's bitmask and a bad_words ban depend on every token the request has, so a step with
such rows cannot be sampled before the host has read the step still in flight. Instead of giving
up the overlap (reading step N before scheduling N+1), the engine schedules N+1 as usual and
launches it in two halves:

    forward N+1 launched -> step N read on the host (matchers advanced, outputs made) ->
    grammar masks filled from the advanced matchers -> sampling of N+1 launched

The device runs N+1's forward pass while the host reads N, so the host work the synchronous
step put between two forward passes now hides under one. Batches without such rows keep the
plain overlapped launch (execute in one call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ladle.engine.messages import EngineCoreOutput

if TYPE_CHECKING:
    from ladle.core.request import Request
    from ladle.core.scheduler import SchedulerOutput
    from ladle.structured.manager import PendingGrammarBitmask
    from ladle.worker.model_runner import LaunchedStep, ModelRunner
    from ladle.worker.persistent_batch import BlockUpdate


class SplitLaunch:
    """An execute(scheduler_output, block_updates) for execute_isolating_faults that reads the
    step in flight (read_previous, once) between the forward pass and the sampling."""

    def __init__(
        self,
        runner: ModelRunner,
        read_previous: Callable[[], list[EngineCoreOutput]],
        fill_grammar_bitmask: Callable[[list[Request]], PendingGrammarBitmask | None] | None,
    ) -> None:
        self._runner = runner
        self._read_previous: Callable[[], list[EngineCoreOutput]] | None = read_previous
        self._fill_grammar_bitmask = fill_grammar_bitmask
        self.previous_outputs: list[EngineCoreOutput] = []

    def __call__(
        self, scheduler_output: SchedulerOutput, block_updates: list[BlockUpdate]
    ) -> LaunchedStep:
        forward = self._runner.launch_forward(scheduler_output, block_updates)
        self.read_previous()
        return self._runner.sample(forward, self._fill_grammar_bitmask)

    def read_previous(self) -> list[EngineCoreOutput]:
        """Read the step in flight if not done yet (a probe of fault isolation or the first
        run did it already); returns its outputs."""
        if self._read_previous is not None:
            read, self._read_previous = self._read_previous, None
            self.previous_outputs = read()
        return self.previous_outputs
