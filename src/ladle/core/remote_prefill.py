"""A consumer request's pointer to its prompt's KV on a prefill instance (core/kv_handoff.py
tells the whole handoff): plain data the request carries, in a file of its own so the request
need not import the handoff bookkeeping, which reaches the request through the block pool."""

from __future__ import annotations

from dataclasses import dataclass

# A pull is ordered at least this long before the producer's hold expires (it runs in the
# next step, milliseconds later); closer than that, the consumer computes the prompt itself.
PULL_MARGIN_S = 2.0


@dataclass
class RemotePrefill:
    """Where a consumer's request finds its prompt's KV."""

    peer: str  # the producer's exported pool (descriptor)
    block_ids: list[int]  # the producer's block table for the prompt
    # When the producer frees them unpulled (time.monotonic(), shared by the processes of one
    # host): a pull ordered too close to it would read blocks that may be someone else's.
    expires_at: float = float("inf")

    def may_pull(self, now: float) -> bool:
        return now < self.expires_at - PULL_MARGIN_S
