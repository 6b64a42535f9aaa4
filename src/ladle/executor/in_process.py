"""The in-process executor: one rank, its Worker in the engine's own thread (today's path)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ladle.config import EngineConfig
from ladle.executor.base import Executor, StartGrammarFill, StepFuture
from ladle.executor.fault_isolation import run_isolating_faults
from ladle.executor.split_launch import launch_step
from ladle.protocol.step import StepPlan, StepResult
from ladle.worker.model_runner import LaunchedStep
from ladle.worker.worker import Worker, WorkerInfo


class LocalStepFuture(StepFuture):
    def __init__(
        self, plan: StepPlan, launched: LaunchedStep | None, failed: dict[str, str]
    ) -> None:
        self.plan = plan
        self._launched = launched
        self._failed = failed

    def kv_operations_at_launch(self) -> tuple[list[int], dict[int, str]] | None:
        report = self._launched.kv_report if self._launched is not None else None
        return (report.done, report.failed) if report is not None else None

    def result(self) -> StepResult:
        if self._launched is None:  # every request failed
            result = StepResult(
                request_ids=self.plan.request_ids(), token_ids=[[] for _ in self.plan.scheduled]
            )
        else:
            result = self._launched.result()
        if self._failed:
            result.failed = self._failed
        return result


class InProcessExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        self.worker = Worker(config)

    @property
    def info(self) -> WorkerInfo:
        return self.worker.info

    @property
    def runner(self):
        """The worker's ModelRunner (introspection: tests, the warm-up's graph check)."""
        return self.worker.runner

    @property
    def grammar_device(self) -> torch.device:
        return self.worker.device

    @property
    def graphs(self):
        return self.worker.runner.graphs

    @property
    def num_graph_steps(self) -> int:
        return self.worker.runner.num_graph_steps

    @property
    def num_eager_steps(self) -> int:
        return self.worker.runner.num_eager_steps

    def expert_token_counts(self) -> tuple[int, ...]:
        return self.worker.expert_load.read()

    def reset_expert_load(self) -> None:
        self.worker.expert_load.reset()

    def submit(
        self,
        plan: StepPlan,
        start_grammar_fill: StartGrammarFill | None = None,
        between: Callable[[], object] | None = None,
    ) -> StepFuture:
        called = False

        def between_once() -> None:
            nonlocal called
            if not called and between is not None:
                called = True
                between()

        def run(step: StepPlan) -> LaunchedStep:
            return launch_step(
                self.worker, step, start_grammar_fill, between_once if between else None
            )

        launched, ran, failed = run_isolating_faults(run, plan)
        between_once()  # every request failed before the split: read the step in flight anyway
        return LocalStepFuture(ran, launched, failed)
