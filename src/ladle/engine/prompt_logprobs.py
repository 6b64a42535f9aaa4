"""Gathers a request's prompt logprobs over its prefill chunks in the engine core and hands
them over whole with the request's first output (worker/prompt_logprobs.py computes them).

Kept by prompt position, so a request preempted and recomputed overwrites rather than
duplicates what it had.
"""

from __future__ import annotations

from ladle.protocol.messages import EngineCoreOutput, TokenLogprobs
from ladle.protocol.step import PromptLogprobsChunk


class PromptLogprobsCollector:
    def __init__(self) -> None:
        # request id -> (prompt length, position -> logprobs of the prompt token there)
        self._pending: dict[str, tuple[int, dict[int, TokenLogprobs]]] = {}

    def add(self, chunks: dict[str, PromptLogprobsChunk] | None) -> None:
        for request_id, chunk in (chunks or {}).items():
            _, by_position = self._pending.setdefault(request_id, (chunk.prompt_len, {}))
            for offset, entry in enumerate(chunk.entries):
                by_position[chunk.first_position + offset] = entry

    def attach(self, outputs: list[EngineCoreOutput]) -> None:
        """Give each output whose request has prompt logprobs the whole list: None for the
        first token (nothing precedes it), then one entry per prompt token."""
        if not self._pending:  # the common step: nobody asked, no per-output lookups
            return
        for output in outputs:
            pending = self._pending.pop(output.request_id, None)
            if pending is None:
                continue
            prompt_len, by_position = pending
            output.prompt_logprobs = [None] + [
                by_position.get(position) for position in range(1, prompt_len)
            ]

    def discard(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._pending.pop(request_id, None)
