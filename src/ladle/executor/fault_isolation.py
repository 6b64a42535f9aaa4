"""Fault isolation for one step: a request that breaks the step is ended alone.

When building or running a step raises, the step is probed one request at a time to find the
request(s) that cause it. The step then runs again without them, and its result names each with
why (StepResult.failed): the engine ends those with finish_reason "error" and every other request
carries on as if nothing happened. Probing is safe to repeat: a step writes the same KV values
for the same tokens, sampling is a pure function of (seed, step), and the penalty history writes
each token at its own index, so a probe changes nothing a later run would not write again.

Only a failure that cannot be pinned on a request ends the engine: an out-of-memory or CUDA
error (the device itself is in doubt), or a failure no single request reproduces. The server
then starts a new engine process (frontend/client.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ladle.protocol.step import StepPlan
from ladle.worker.model_runner import LaunchedStep

logger = logging.getLogger(__name__)

# Text of errors that mean the device is broken rather than one request's input.
_DEVICE_FAILURE_MARKERS = ("CUDA error", "CUBLAS_STATUS", "device-side assert", "illegal memory")


def may_be_attributed(error: BaseException) -> bool:
    """False for failures of the device itself, which no request can be blamed for."""
    if isinstance(error, torch.OutOfMemoryError):
        return False
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(error, accelerator_error):
        return False
    return not any(marker in str(error) for marker in _DEVICE_FAILURE_MARKERS)


def run_isolating_faults(
    run: Callable[[StepPlan], LaunchedStep], plan: StepPlan
) -> tuple[LaunchedStep | None, StepPlan, dict[str, str]]:
    """run(plan), leaving out the requests that make it fail.

    Returns (the launched step; the plan that ran, with nothing scheduled when every request
    failed; request id -> what failed). Re-raises when the failure cannot be attributed to a
    request."""
    try:
        return run(plan), plan, {}
    except Exception as error:
        if not may_be_attributed(error):
            raise
        logger.exception("a step failed; looking for the request that caused it")
        step_error = error
    culprits = _find_culprits(run, plan)
    if not culprits:
        raise step_error  # no single request reproduces it: nothing to isolate
    for request_id, message in culprits.items():
        logger.error("ending request %s: %s", request_id, message)
    kept = plan.without(set(culprits))
    # Even with nothing left scheduled it runs: the workers still forget what the plan says,
    # and its KV copies are reported (their blocks are pinned until they are).
    return run(kept), kept, culprits


def _find_culprits(run: Callable[[StepPlan], LaunchedStep], plan: StepPlan) -> dict[str, str]:
    """{request id: what failed} for each request whose step alone fails."""
    culprits = {}
    for scheduled in plan.scheduled:
        try:
            run(plan.only(scheduled.request_id))
        except Exception as error:
            if not may_be_attributed(error):
                raise
            culprits[scheduled.request_id] = f"{type(error).__name__}: {error}"
    return culprits
