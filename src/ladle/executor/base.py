"""The executor: fans a StepPlan out to the workers and hands back a future of its StepResult.

Two kinds: in-process (the worker runs in the engine's own thread: one rank, today's speed) and
multi-process (one worker process per rank, plans sent to every rank, results from rank 0). The
engine keeps at most one step in flight: it submits step N+1, then reads step N.

    future = executor.submit(plan, start_grammar_fill, between)
    ... schedule the next step ...
    result = future.result()     # StepResult; future.plan is the plan that ran

`between` (a step whose sampling reads host tokens while another is in flight) is called after
the forward pass is launched and before sampling (split_launch.py). A request that makes the
step fail is left out (fault_isolation.py): result.failed names it, future.plan no longer has it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from ladle.protocol.step import StepPlan, StepResult
from ladle.structured.manager import PendingGrammarBitmask

StartGrammarFill = Callable[[StepPlan], PendingGrammarBitmask | None]


class StepFuture(ABC):
    """A submitted step. plan: what ran (the submitted plan minus requests that failed)."""

    plan: StepPlan

    @abstractmethod
    def result(self) -> StepResult:
        """Wait for the step's accepted tokens (once; later calls return the same result)."""

    def kv_operations_at_launch(self) -> tuple[list[int], dict[int, str]] | None:
        """The plan's KV operations issued and failed, known as soon as the step is launched
        (the worker issues them before its forward), or None where only result() tells (a
        worker in another process). The engine settles them at once, so a request whose
        prefix is being loaded from the host tier can run in the very next plan: that plan's
        forward waits for this step's copies on the device (worker/kv_copier.py)."""
        return None


class Executor(ABC):
    @property
    @abstractmethod
    def info(self):
        """The workers' WorkerInfo (rank 0's)."""

    @property
    def rank_infos(self) -> list:
        """Every rank's WorkerInfo, in rank order (one rank: [info])."""
        return [self.info]

    @abstractmethod
    def submit(
        self,
        plan: StepPlan,
        start_grammar_fill: StartGrammarFill | None = None,
        between: Callable[[], object] | None = None,
    ) -> StepFuture:
        """Launch the step on every rank."""

    @property
    def grammar_device(self) -> torch.device:
        """Where the engine's grammar masks go: the workers' device in-process, else the host
        (they travel to the worker processes as plain data)."""
        return torch.device("cpu")

    @property
    def graphs(self):
        """The in-process worker's captured CUDA graphs (the warm-up toggles and describes
        them); None elsewhere."""
        return None

    @property
    def num_graph_steps(self) -> int:
        return 0

    @property
    def num_eager_steps(self) -> int:
        return 0

    def expert_token_counts(self) -> tuple[int, ...]:
        """Tokens routed to each expert since start-up, summed over MoE layers
        (worker/expert_load.py); () for a dense model or where the workers are not in this
        process."""
        return ()

    def reset_expert_load(self) -> None:
        """Zero the per-expert counts (after the warm-up)."""
        return None

    def shutdown(self) -> None:
        """Stop the workers (a no-op in-process)."""
        return None
