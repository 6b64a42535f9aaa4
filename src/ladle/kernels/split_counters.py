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
