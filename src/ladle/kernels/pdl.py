"""Programmatic dependent launch (Hopper and later): a decode GEMV starts reading its weights
while the small kernel before it is still running.

A batch-1 decode step of the 8B shape is ~340 launches; each weight-streaming GEMV used to start
only when the norm, SiLU or attention launch before it had finished, then wait a full memory
latency for its first weights. With PDL the kernel before it signals early
(`allow_next_kernel`: griddepcontrol.launch_dependents, right at its start), the GEMV's programs
become resident on the SMs it leaves free, load their first weight tiles (which no kernel writes)
and only then wait (`wait_for_previous_kernel`: griddepcontrol.wait) for the previous kernel to
finish and its writes to be visible, before they read the activations or write anything.

Safe by construction: every program of a launched-with-PDL kernel waits before its first read of
another kernel's output and before its first write (so it completes only after the kernel before
it, which keeps stream order transitive for whatever follows), and the signal is a no-op when the
next launch is an ordinary one. CUDA graphs keep the edges (stream capture turns them into
programmatic dependencies). LADLE_PDL=0 in the environment turns it off.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

PDL_ENV = "LADLE_PDL"
_enabled = os.environ.get(PDL_ENV, "1") != "0"


@functools.cache
def _has_pdl(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_enabled(device: torch.device) -> bool:
    """Whether launches on `device` use programmatic dependent launch."""
    if not _enabled or device.type != "cuda":
        return False
    return _has_pdl(device.index if device.index is not None else torch.cuda.current_device())


@triton.jit
def wait_for_previous_kernel(ENABLED: tl.constexpr):
    """Block until the previous kernel in the stream has finished and its writes are visible."""
    if ENABLED:
        gdc_wait()


@triton.jit
def allow_next_kernel(ENABLED: tl.constexpr):
    """Let a next kernel launched with PDL start its programs now (they wait before reading)."""
    if ENABLED:
        gdc_launch_dependents()
