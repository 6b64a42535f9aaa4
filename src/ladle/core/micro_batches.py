"""Micro-batches under pipeline parallelism: which running requests a step may take.

With S pipeline stages the engine keeps up to S steps in flight (engine/engine_core.py), so
that while the last stage computes one step the first computes the next. Two rules make those
steps real micro-batches:

- A request whose sampled token is still in flight is not scheduled again until its step is
  read: the first stage could not have that token before the last stage samples it, so the
  next step would wait for the whole pipeline. (A prompt chunk that samples nothing may run in
  the next step: every stage runs the steps in order, so its earlier chunk's KV is there.)
- The decodes split evenly across the steps in flight: a step takes at most ceil(D / S) of the
  D running decodes, so the next step finds the rest, and the micro-batches stay balanced.

Prompt chunks need no cap of their own: a long prompt's chunks fill successive steps, and
waiting prompts fill each step's budget as it comes. Everything else (the one token budget,
preemption, drafts) is the scheduler's as ever.
"""

from __future__ import annotations

from ladle.core.request import Request


class MicroBatches:
    def __init__(self, num_stages: int) -> None:
        self.num_stages = num_stages
        self._decode_cap = 0
        self._num_decodes = 0

    def begin_step(self, running: list[Request]) -> None:
        """Size this step's share of the running decodes (in flight or not)."""
        num_decoding = sum(1 for request in running if _is_decoding(request))
        self._decode_cap = -(-num_decoding // self.num_stages)
        self._num_decodes = 0

    def admits(self, request: Request) -> bool:
        """Whether the running request may take part in this step; counts it if so (the
        scheduler may still fail to give it blocks: then the step is simply smaller)."""
        if request.num_pending_tokens:
            return False
        if _is_decoding(request):
            if self._num_decodes >= self._decode_cap:
                return False
            self._num_decodes += 1
        return True


def _is_decoding(request: Request) -> bool:
    """At (or past, with its token in flight) the end of its known tokens: one token a step."""
    return request.num_computed_tokens >= request.num_tokens + request.num_pending_tokens - 1
