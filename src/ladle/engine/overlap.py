"""Overlapped scheduling: schedule and submit step N+1 while the device runs step N.

EngineCore.step() submits a step and then reads the result of the step before it, so the host's
scheduling, input building and output handling run while the device computes. The scheduler
counts a submitted step's tokens as computed and its samples as pending
(Request.num_pending_tokens); the worker feeds a decode row whose last token is pending from the
device copy of that token. A request that the earlier step ends (EOS, a stop id) may already sit
in the next step: that token is computed and thrown away, never reported. A request that ends by
length is known to end before its token is read, so it is not scheduled again.

A request that verifies draft tokens has its next step planned while its step runs too when the
drafts are made on the device (spec_decode/placement.py: n-gram drafts): the step is planned for
the worst case (every draft accepted) and moved back on the device by the drafts that were
rejected (core/drafts_in_flight.py, worker/drafts_on_device.py). Other drafted requests (suffix
and model drafts, which the host reads) are not scheduled again until their step is read: how
many drafts they accept decides where their next step starts.

Some requests' sampling needs every token on the host: a grammar (its bitmask follows the tokens
accepted so far) and bad_words (a word's last token is banned once the output ends with the rest
of it). Their steps still overlap, with the launch split in two (executor/split_launch.py): the
forward pass of step N+1 is launched first, step N is read while it runs, the matchers advance,
and only then is N+1 sampled. The repetition / presence / frequency penalties need nothing of the
host: their token ids live on the device (worker/penalty_history.py).

Under pipeline parallelism with S stages the engine keeps up to S steps in flight, each a
micro-batch of other requests (core/micro_batches.py): it submits a step and reads the oldest
only once S are submitted, so while it waits for the last stage's step the first stage already
computes the next. A request is then never scheduled while its token is in flight, so no step
needs a split launch either.
"""

from __future__ import annotations

from ladle.config import SchedulerConfig


def overlap_enabled(config: SchedulerConfig, device_type: str) -> bool:
    """Whether steps overlap: the user's choice, else on CUDA only (SchedulerConfig.overlaps_on;
    spec_decode/placement.py asks the same for the workers, which import nothing of here)."""
    return config.overlaps_on(device_type)


def steps_in_flight(config: SchedulerConfig, pipeline_parallel_size: int, device_type: str) -> int:
    """How many submitted steps the engine keeps unread at most (counting the one it just
    submitted): one per pipeline stage under pipeline parallelism (on every device: the stages
    are processes of their own), unless the user turned overlap off; two with overlapped
    scheduling; one when each step is read as soon as it is submitted."""
    if config.async_scheduling is False:
        return 1
    if pipeline_parallel_size > 1:
        return pipeline_parallel_size
    return 2 if overlap_enabled(config, device_type) else 1
