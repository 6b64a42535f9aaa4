"""Overlapped scheduling: schedule and launch step N+1 while the device runs step N.

EngineCore.step() launches a step and then reads the sampled ids of the step before it, so the
host's scheduling, input building and output handling run while the device computes. The
scheduler counts a launched step's tokens as computed and its samples as pending
(Request.num_pending_tokens); the model runner feeds a decode row whose last token is pending
from the device copy of that token. A request that the earlier step ends (EOS, a stop id) may
already sit in the next step: that token is computed and thrown away, never reported. A request
that ends by length is known to end before its token is read, so it is not scheduled again.

Some requests' sampling needs every token on the host: a grammar (its bitmask follows the tokens
accepted so far) and bad_words (a word's last token is banned once the output ends with the rest
of it). Their steps still overlap, with the launch split in two (split_launch.py): the forward
pass of step N+1 is launched first, step N is read while it runs, the matchers advance, and only
then is N+1 sampled. The repetition / presence / frequency penalties need nothing of the host:
their token ids live on the device (worker/penalty_history.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ladle.config import SchedulerConfig
from ladle.core.request import Request
from ladle.core.scheduler import SchedulerOutput
from ladle.worker.model_runner import LaunchedStep


@dataclass
class InFlightStep:
    """A launched step whose sampled ids the host has not read yet."""

    scheduler_output: SchedulerOutput
    launched: LaunchedStep


def needs_host_tokens(request: Request) -> bool:
    """Whether sampling the request's next token needs its latest token on the host."""
    params = request.sampling_params
    return params.structured_outputs is not None or bool(params.bad_words_token_ids)


@dataclass
class OverlapPolicy:
    """Whether steps overlap, and whether live requests need their launches split."""

    enabled: bool
    _host_token_request_ids: set[str] = field(default_factory=set)

    @classmethod
    def from_config(cls, config: SchedulerConfig, device: torch.device) -> OverlapPolicy:
        enabled = config.async_scheduling
        if enabled is None:
            # On the CPU the host computes the step itself: there is nothing to overlap with.
            enabled = device.type == "cuda"
        return cls(enabled=enabled)

    def track(self, request: Request) -> None:
        if self.enabled and needs_host_tokens(request):
            self._host_token_request_ids.add(request.request_id)

    def forget(self, request_ids: list[str]) -> None:
        if self._host_token_request_ids:
            self._host_token_request_ids.difference_update(request_ids)

    def needs_split_launch(self) -> bool:
        """Whether the next step must read the one in flight between its forward and its
        sampling (some live request needs host tokens to sample)."""
        return self.enabled and bool(self._host_token_request_ids)
