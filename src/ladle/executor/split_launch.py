"""A step launched in two halves, with the step before it read in between.

A grammar's bitmask and a bad_words ban depend on every token the request has, so a step with
such rows cannot be sampled before the host has read the step still in flight. Instead of giving
up the overlap (reading step N before scheduling N+1), the engine schedules N+1 as usual and the
executor launches it in two halves:

    forward N+1 launched -> step N read on the host (matchers advanced, outputs made, the
    worker's tokens updated) -> grammar masks filled from the advanced matchers -> sampling of
    N+1 launched

The device runs N+1's forward pass while the host reads N, so the host work the synchronous
step put between two forward passes now hides under one. Steps without such rows keep the plain
overlapped launch (execute in one call).
"""

from __future__ import annotations

from collections.abc import Callable

from ladle.protocol.step import StepPlan
from ladle.structured.manager import PendingGrammarBitmask
from ladle.worker.model_runner import LaunchedStep
from ladle.worker.worker import Worker

# The engine's grammar hook: start filling a plan's grammar rows' masks (None: none has one).
StartGrammarFill = Callable[[StepPlan], PendingGrammarBitmask | None]


def launch_step(
    worker: Worker,
    plan: StepPlan,
    start_grammar_fill: StartGrammarFill | None,
    between: Callable[[], object] | None,
) -> LaunchedStep:
    """Launch a step on an in-process worker: in one call, or split around `between` (reading
    the step in flight; called once however often the plan is run, see fault_isolation.py)."""
    if between is None:
        # Started just before the forward: on the CPU it fills while this thread computes.
        pending = start_grammar_fill(plan) if start_grammar_fill is not None else None
        return worker.execute(plan, pending)
    forward = worker.launch_forward(plan)
    between()
    pending = start_grammar_fill(plan) if start_grammar_fill is not None else None
    return worker.sample(forward, pending)
