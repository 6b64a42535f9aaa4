"""Sampled ids that a pipeline stage before the last receives, and applies only when needed.

With several steps in flight (pipeline.py), stage 0 launches step N+1 before the last stage has
sampled step N. Step N's ids come back through an asynchronous broadcast into a buffer of its
own (a SharedSample); nothing waits for it at launch. It is applied to the persistent batch's
device copy of each row's last token (where a later decode row reads its input id) only when
a later plan runs one of its requests, or once it has arrived anyway, and always in step order,
so a slot reused by a newer request is written by the newer step last. The host reads the ids
(the request states take them) when the worker reads the step's result.

A step that verified drafts has several rows per request, and the token the request goes on
from is the one verification emitted last (the first row that refused its draft, or the bonus
row), not its last row (worker/last_emitted.py writes that one).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch

from ladle.worker.last_emitted import write_last_tokens


@dataclass(frozen=True)
class DraftedRows:
    """A step's sampling rows ((request position, drafts before the row), as
    StepPlan.sampling_rows) and each scheduled request's host-drafted ids."""

    rows: list[tuple[int, int]]
    drafts: list[list[int]]


@dataclass
class SharedSample:
    """One step's sampled ids, on their way from the last stage."""

    request_ids: frozenset[str]  # the requests that sampled in the step
    work: object  # the broadcast's torch.distributed Work
    buffer: torch.Tensor  # [num_rows] int64 on the device, final once the work is
    slots: torch.Tensor  # each row's slot in the persistent batch
    # CUDA: where the host copy waits for the broadcast, so the compute stream never does.
    side_stream: torch.cuda.Stream | None = None
    drafted: DraftedRows | None = None  # set when the step verified drafts
    _host: torch.Tensor | None = None

    def is_ready(self) -> bool:
        return self.work.is_completed()

    def host(self) -> torch.Tensor:
        """The ids on the host, waiting for them if they have not arrived (on the CPU the work
        itself; on CUDA a side stream waits, so the compute stream never does)."""
        if self._host is None:
            if self.side_stream is None:
                self.work.wait()
                self._host = self.buffer
            else:
                with torch.cuda.stream(self.side_stream):
                    self.work.wait()  # the side stream waits on the broadcast
                    host = torch.empty(self.buffer.shape, dtype=self.buffer.dtype, pin_memory=True)
                    host.copy_(self.buffer, non_blocking=True)
                self.side_stream.synchronize()
                self._host = host
        return self._host


class SharedSamples:
    """The steps whose ids this stage has not applied to its device copies yet, in order."""

    def __init__(self, device: torch.device) -> None:
        self._pending: deque[SharedSample] = deque()
        self._device = device
        self._side_stream: torch.cuda.Stream | None = None  # made at the first step on CUDA

    def __len__(self) -> int:
        return len(self._pending)

    def add(
        self, request_ids: frozenset[str], work, buffer: torch.Tensor, slots: torch.Tensor,
        drafted: DraftedRows | None = None,
    ) -> SharedSample:
        """A step's ids, on their way into `buffer` through `work`; drafted: its rows and
        drafts when it verified some."""
        if self._device.type == "cuda" and self._side_stream is None:
            self._side_stream = torch.cuda.Stream(self._device)
        sample = SharedSample(request_ids, work, buffer, slots, self._side_stream, drafted)
        self._pending.append(sample)
        return sample

    def apply_before(self, request_ids: list[str], last_sampled: torch.Tensor) -> None:
        """Apply, in step order, every pending step a plan of `request_ids` reads a token of
        (and all before it), and any that has arrived already."""
        needed = set(request_ids)
        last_needed = -1
        for position, sample in enumerate(self._pending):
            if not needed.isdisjoint(sample.request_ids):
                last_needed = position
        position = 0
        while self._pending and (position <= last_needed or self._pending[0].is_ready()):
            sample = self._pending.popleft()
            # On CUDA the compute stream waits for the broadcast (long done if it was needed).
            sample.work.wait()
            if sample.drafted is None:
                last_sampled.index_copy_(0, sample.slots, sample.buffer)
            else:
                drafted = sample.drafted
                write_last_tokens(
                    last_sampled, sample.buffer, sample.slots, drafted.rows, drafted.drafts
                )
            position += 1
