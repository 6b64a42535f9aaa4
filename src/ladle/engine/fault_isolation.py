"""Fault isolation for one engine step: a request that breaks the step is ended alone.

When building or running a step raises, the step is probed one request at a time to find the
request(s) that cause it. Those end with finish_reason "error" and a message saying why (their
KV blocks are freed), and the step runs again without them, so every other request carries on
as if nothing happened. Probing is safe to repeat: a step writes the same KV values for the
same tokens, and sampling is a pure function of (seed, step), so a probe changes nothing a
later run would not write again.

Only a failure that cannot be pinned on a request ends the engine: an out-of-memory or CUDA
error (the device itself is in doubt), or a failure no single request reproduces. The server
then starts a new engine process (client.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ladle.core.request import RequestStatus
from ladle.engine.messages import EngineCoreOutput

if TYPE_CHECKING:
    from ladle.core.scheduler import Scheduler, SchedulerOutput
    from ladle.worker.persistent_batch import BlockUpdate

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


def execute_isolating_faults(
    execute: Callable[[SchedulerOutput, list[BlockUpdate]], Any],
    scheduler: Scheduler,
    scheduler_output: SchedulerOutput,
    block_ids: list[BlockUpdate],
) -> tuple[Any, list[EngineCoreOutput]]:
    """execute(scheduler_output, block_ids), ending the requests that make it fail.
    block_ids: per scheduled request, its block-table update (the runner's persistent batch
    applies one idempotently, so a probe or a second run may apply it again).

    Returns (runner output, the failed requests' final outputs). The failed requests are
    removed from scheduler_output in place, so the runner output lines up with what remains.
    Re-raises when the failure cannot be attributed to a request."""
    try:
        return execute(scheduler_output, block_ids), []
    except Exception as error:
        if not may_be_attributed(error):
            raise
        logger.exception("a step failed; looking for the request that caused it")
        step_error = error
    culprits = _find_culprits(execute, scheduler_output, block_ids)
    if not culprits:
        raise step_error  # no single request reproduces it: nothing to isolate
    failed_outputs = []
    for request_id, message in culprits.items():
        logger.error("ending request %s: %s", request_id, message)
        failed_outputs.append(
            EngineCoreOutput(
                request_id=request_id, new_token_ids=[], finish_reason="error",
                error=f"the engine failed on this request and ended it: {message}",
            )
        )
    keep = [
        index for index, request in enumerate(scheduler_output.scheduled_requests)
        if request.request_id not in culprits
    ]
    scheduler_output.scheduled_requests[:] = [
        scheduler_output.scheduled_requests[index] for index in keep
    ]
    for request_id in culprits:
        scheduler_output.num_scheduled_tokens.pop(request_id, None)
    kept_block_ids = [block_ids[index] for index in keep]
    scheduler.finish_requests(list(culprits), RequestStatus.FINISHED_REJECTED)
    if not scheduler_output.scheduled_requests:
        return None, failed_outputs
    return execute(scheduler_output, kept_block_ids), failed_outputs


def _find_culprits(
    execute: Callable[[SchedulerOutput, list[BlockUpdate]], Any],
    scheduler_output: SchedulerOutput,
    block_ids: list[BlockUpdate],
) -> dict[str, str]:
    """{request id: what failed} for each request whose step alone fails."""
    culprits = {}
    for request, request_block_ids in zip(
        scheduler_output.scheduled_requests, block_ids, strict=True
    ):
        alone = dataclasses.replace(
            scheduler_output,
            scheduled_requests=[request],
            num_scheduled_tokens={
                request.request_id: scheduler_output.num_scheduled_tokens[request.request_id]
            },
            preempted_request_ids=[],
        )
        try:
            execute(alone, [request_block_ids])
        except Exception as error:
            if not may_be_attributed(error):
                raise
            culprits[request.request_id] = f"{type(error).__name__}: {error}"
    return culprits
