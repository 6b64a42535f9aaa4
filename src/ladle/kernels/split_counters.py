"""Per-tile arrival counters for kernels that split a reduction over programs and let the
program that arrives last combine the parts (no second launch): kernels/int4_decode.py's split-K
tiles and kernels/paged_attention.py's split-KV decode.

One zeroed int32 buffer per device, shared by every such kernel: a program takes a ticket with
an atomic add, and the last one of its tile resets the counter to zero, so every launch leaves
the buffer as it found it. That is only correct while launches on a device are serialized, which
holds for ladle's single compute stream (and for CUDA graphs, which replay on one stream).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Room for the per-tile counters of the widest layer at the largest kernel batch (70B gate_up at
# 64 columns per tile and 64 token rows needs 57k); a launch that would need more runs unsplit.
COUNTER_CAPACITY = 1 << 18
_counters: dict[torch.device, torch.Tensor] = {}


def counter_buffer(device: torch.device) -> torch.Tensor:
    """The device's zeroed [COUNTER_CAPACITY] int32 counters."""
    buffer = _counters.get(device)
    if buffer is None:
        buffer = torch.zeros(COUNTER_CAPACITY, dtype=torch.int32, device=device)
        _counters[device] = buffer
    return buffer


@triton.jit
def arrives_last(counter_ptr, num_splits):
    """Take this program's ticket from its tile's counter: true for the last of the tile's
    num_splits programs to arrive, which then combines every split's partial (read them from L2,
    .cg: other SMs wrote them) and calls reset_counter. Called once every partial of this
    program is stored: the barrier orders all its threads' stores before the ticket, and the
    acquire-release add publishes them at GPU scope."""
    tl.debug_barrier()
    return tl.atomic_add(counter_ptr, 1, sem="acq_rel") == num_splits - 1


@triton.jit
def reset_counter(counter_ptr):
    """The last arrival leaves its tile's counter at zero for the next launch."""
    tl.atomic_xchg(counter_ptr, 0)
