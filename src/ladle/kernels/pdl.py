"""Programmatic dependent launch (Hopper and later): each kernel of a decode step is resident
and waiting when the one before it finishes, and a GEMV reads its first weights meanwhile.

A batch-1 decode step of the 8B shape is ~300 launches of a few microseconds each, so the launch
latency between them and each GEMV's first trip to memory are a large part of the step. Every
Triton kernel of the decode path is launched with PDL and, at its start, signals that the next
one may launch (`allow_next_kernel`: griddepcontrol.launch_dependents): the next kernel's programs
then become resident on the SMs this one leaves free. They wait (`wait_for_previous_kernel`:
griddepcontrol.wait) for this kernel to finish and its writes to be visible before they read its
output or write anything; a GEMV first loads its first weight tiles, which no kernel writes.

Safe by construction: every program of a launched-with-PDL kernel waits before its first read of
another kernel's output, its first write and any early exit (so it completes only after the
kernel before it, which keeps stream order transitive for whatever follows), and the signal is a
no-op when the next launch is an ordinary one (torch's kernels, cuBLAS). A next kernel can only
launch once every program of this one has started, so it never takes an SM that this one's own
programs need. CUDA graphs keep the edges (stream capture turns them into
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
    # NVIDIA from Hopper (sm_90) on; ROCm reports its own capability numbers and has no PDL.
    return torch.version.hip is None and torch.cuda.get_device_capability(device_index)[0] >= 9


# Launches of more rows than this go without: their kernels run long enough that a launch's
# latency is a small part of them (W2's batch-256 steps measured 0.3% slower with it).
MAX_ROWS = 64


def pdl_enabled(device: torch.device, num_rows: int = 1) -> bool:
    """Whether a launch over num_rows rows (tokens, or requests for attention) on `device` uses
    programmatic dependent launch."""
    if not _enabled or device.type != "cuda" or num_rows > MAX_ROWS:
        return False
    return _has_pdl(device.index if device.index is not None else torch.cuda.current_device())


def pdl_launch(device: torch.device, num_rows: int = 1, eligible: bool = True) -> dict[str, bool]:
    """A launch's PDL options, to pass as **kwargs: the kernel's USE_PDL constexpr and Triton's
    launch_pdl attribute, always equal (a kernel launched with PDL that does not wait, or one
    that waits without it, is what this module's safety rests on never happening)."""
    enabled = eligible and pdl_enabled(device, num_rows)
    return {"USE_PDL": enabled, "launch_pdl": enabled}


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


@triton.jit
def enter_dependent_launch(ENABLED: tl.constexpr):
    """The start of a kernel in the PDL chain that reads its inputs at once: let the next kernel
    launch, then wait for the previous one."""
    allow_next_kernel(ENABLED)
    wait_for_previous_kernel(ENABLED)
