"""Swap or recompute a preempted request: the rule, as a pure function, and the measured rates.

A preempted request loses its place in the device pool. When it resumes it needs the KV of its
computed tokens again, either copied back from the host tier (swap) or computed again (recompute,
vLLM v1's only way). With the host tier written back as blocks fill (kv_transfers.py), most of a
victim's full blocks are already on the host when it is preempted; the rest would have to be
copied out first. So per victim:

    swap      = (blocks to copy out + blocks to copy back) x block bytes / copy bandwidth
                + per-copy latency x 2 + the tail (its last partial block) recomputed
    recompute = every computed token at the prefill rate

and the cheaper wins (ties go to recompute, today's behaviour). Only whole blocks can be
swapped: the tail is recomputed either way. The copy bandwidth is measured at start-up by the
worker (worker/kv_copier.py); the prefill rate comes from the engine's step timings (a moving
average of prompt tokens per second), and until it is known `auto` recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ladle.config import PREEMPTION_MODES

# A copy's fixed cost beyond its bytes: stream waits, launches, one step of delay before the
# request's prefill can start (seconds; a few launches and a short step on an H100).
COPY_LATENCY_S = 200e-6


def prefers_swap(
    num_computed_tokens: int,
    num_blocks_on_host: int,
    block_size: int,
    block_bytes: int,
    copy_bytes_per_s: float,
    prefill_tokens_per_s: float,
    copy_latency_s: float = COPY_LATENCY_S,
) -> bool:
    """Whether copying a victim's blocks out and back costs less time than recomputing them.

    num_blocks_on_host: of its full computed blocks, those the host tier already holds."""
    if num_computed_tokens < 0 or num_blocks_on_host < 0:
        raise ValueError("token and block counts must be >= 0")
    if copy_bytes_per_s <= 0 or prefill_tokens_per_s <= 0:
        raise ValueError("copy_bytes_per_s and prefill_tokens_per_s must be > 0")
    num_full_blocks = num_computed_tokens // block_size
    if num_full_blocks == 0:
        return False
    num_to_store = max(0, num_full_blocks - num_blocks_on_host)
    copy_s = (num_to_store + num_full_blocks) * block_bytes / copy_bytes_per_s + 2 * copy_latency_s
    tail_s = (num_computed_tokens - num_full_blocks * block_size) / prefill_tokens_per_s
    recompute_s = num_computed_tokens / prefill_tokens_per_s
    return copy_s + tail_s < recompute_s


@dataclass
class PreemptionPolicy:
    """The configured mode plus the rates `auto` decides with (updated while serving)."""

    mode: str = "auto"
    block_size: int = 16
    block_bytes: int = 0
    copy_bytes_per_s: float = 0.0  # measured by the worker at start-up; 0: unknown
    prefill_tokens_per_s: float = 0.0  # the engine's moving average; 0: unknown

    def __post_init__(self) -> None:
        if self.mode not in PREEMPTION_MODES:
            raise ValueError(
                f"preemption_mode must be one of {', '.join(PREEMPTION_MODES)}, got {self.mode!r}"
            )

    def swaps(self, num_computed_tokens: int, num_blocks_on_host: int) -> bool:
        """Whether this victim resumes from the host tier (True) or recomputes (False)."""
        if self.mode != "auto":
            return self.mode == "swap"
        if self.copy_bytes_per_s <= 0 or self.prefill_tokens_per_s <= 0 or self.block_bytes <= 0:
            return False
        return prefers_swap(
            num_computed_tokens,
            num_blocks_on_host,
            self.block_size,
            self.block_bytes,
            self.copy_bytes_per_s,
            self.prefill_tokens_per_s,
        )
