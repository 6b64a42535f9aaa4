"""The two halves of a prefill/decode handoff, as the schedulers see them.

Producer (prefill instance): a request that asked for a remote decode ends after its first
token, but its blocks are not freed: HeldHandoffs keeps them (one reference each) under the
request id until the API process releases them (the consumer has pulled them, or the request
was aborted), or until a timeout frees them for a consumer that never came. Its full blocks are
in the prefix cache already, so a later prompt with the same prefix still hits them.

Consumer (decode instance): a request arrives with its prompt, the producer's first token (an
output already) and the producer's block ids. The scheduler gives it its own prefix hits, fresh
blocks for the rest of the prompt, and orders a pull of only the blocks it lacks: a KVOperation
of kind "pull" in the next plan. Meanwhile it waits in WAITING_FOR_KV, outside the batch. When
the result reports the pull done, its whole prompt is computed and it decodes; when the pull
failed (the producer died, say) it recomputes the prompt here instead: the tokens are the same.
Pull op ids count down from -1, so they never collide with the host tier's (counting up).
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from ladle.core.block_pool import BlockPool, KVBlock
from ladle.protocol.step import KV_PULL, KVOperation


@dataclass
class _Held:
    blocks: list[KVBlock]
    deadline: float
    sampling_seed: int


class HeldHandoffs:
    """A producer's handed-off prompts: blocks kept for a consumer to pull."""

    def __init__(self, block_pool: BlockPool, timeout_s: float) -> None:
        self.block_pool = block_pool
        self.timeout_s = timeout_s
        self._held: dict[str, _Held] = {}
        self.num_handed_off = 0
        self.num_expired = 0

    def hold(
        self, request_id: str, blocks: list[KVBlock], sampling_seed: int, now: float | None = None
    ) -> None:
        now = time.monotonic() if now is None else now
        self._held[request_id] = _Held(blocks, now + self.timeout_s, sampling_seed)
        self.num_handed_off += 1

    def describe(self, request_id: str) -> tuple[list[int], int, float] | None:
        """(the held block ids, the request's sampling seed, when the hold expires: this
        host's monotonic clock); None once released."""
        held = self._held.get(request_id)
        if held is None:
            return None
        return [block.block_id for block in held.blocks], held.sampling_seed, held.deadline

    def release(self, request_ids: list[str]) -> int:
        """Free the blocks held for these requests (unknown ids are ignored); returns how many
        handoffs were released."""
        released = 0
        for request_id in request_ids:
            held = self._held.pop(request_id, None)
            if held is not None:
                self.block_pool.free_blocks(reversed(held.blocks))
                released += 1
        return released

    def expire(self, now: float | None = None) -> list[str]:
        """Release handoffs no consumer pulled in time; returns their ids."""
        if not self._held:
            return []
        now = time.monotonic() if now is None else now
        expired = [rid for rid, held in self._held.items() if held.deadline <= now]
        self.release(expired)
        self.num_expired += len(expired)
        return expired

    @property
    def num_held(self) -> int:
        return len(self._held)

    @property
    def num_held_blocks(self) -> int:
        return sum(len(held.blocks) for held in self._held.values())


@dataclass
class FinishedPulls:
    pulled: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # request id -> why


class RemotePulls:
    """A consumer's pulls: ordered by the scheduler, carried by plans, settled by results."""

    def __init__(self) -> None:
        self._op_ids = itertools.count(-1, -1)
        self._to_issue: list[KVOperation] = []
        self._request_of_op: dict[int, str] = {}
        self._op_of_request: dict[str, int] = {}
        self._num_blocks_of_op: dict[int, int] = {}
        self.num_pulled = 0
        self.num_blocks_pulled = 0
        self.num_failed = 0
        self.num_too_late = 0  # handoffs the scheduler computed instead: too close to expiry

    def start(self, request_id: str, peer: str, source_ids: list[int], targets: list[int]) -> None:
        if request_id in self._op_of_request:
            raise ValueError(f"request {request_id} is already pulling KV")
        op_id = next(self._op_ids)
        self._request_of_op[op_id] = request_id
        self._op_of_request[request_id] = op_id
        self._num_blocks_of_op[op_id] = len(targets)
        self._to_issue.append(KVOperation(KV_PULL, list(source_ids), list(targets), op_id, peer))

    def take_operations(self) -> list[KVOperation]:
        operations, self._to_issue = self._to_issue, []
        return operations

    def finish(self, done_ids: list[int], failed: dict[int, str]) -> FinishedPulls:
        """Settle the pulls a result reports; other op ids (the host tier's, cancelled pulls)
        are ignored."""
        finished = FinishedPulls()
        for op_id in done_ids:
            num_blocks = self._num_blocks_of_op.pop(op_id, 0)
            request_id = self._settle(op_id)
            if request_id is not None and op_id not in failed:
                finished.pulled.append(request_id)
                self.num_pulled += 1
                self.num_blocks_pulled += num_blocks
        for op_id, why in failed.items():
            self._num_blocks_of_op.pop(op_id, None)
            request_id = self._settle(op_id)
            if request_id is not None:
                self.num_failed += 1
                finished.failed[request_id] = why
        return finished

    def cancel(self, request_id: str) -> None:
        """Forget a request's pull (aborted while waiting for it). A pull already issued still
        runs, into blocks the caller frees now: the worker runs a plan's KV operations before
        its forward, so no later step's writes to those blocks can come first."""
        op_id = self._op_of_request.pop(request_id, None)
        if op_id is None:
            return
        self._request_of_op.pop(op_id, None)
        self._num_blocks_of_op.pop(op_id, None)
        self._to_issue = [op for op in self._to_issue if op.op_id != op_id]

    def _settle(self, op_id: int) -> str | None:
        request_id = self._request_of_op.pop(op_id, None)
        if request_id is not None:
            self._op_of_request.pop(request_id, None)
        return request_id

    @property
    def num_in_flight(self) -> int:
        return len(self._request_of_op)


def disaggregation_stats(handoffs: HeldHandoffs | None, pulls: RemotePulls, transfers) -> dict:
    """SchedulerStats' disaggregation fields: the producer's holds, the consumer's pulls
    (transfers: the worker's KVTransferStats totals, for bytes and seconds)."""
    return {
        "num_kv_pulls": pulls.num_pulled,
        "num_kv_pull_blocks": pulls.num_blocks_pulled,
        "kv_pull_bytes": transfers.bytes_pulled,
        "kv_pull_seconds": transfers.pull_seconds,
        "num_kv_pulls_failed": pulls.num_failed,
        "num_kv_pulls_too_late": pulls.num_too_late,
        "num_kv_handoffs": handoffs.num_handed_off if handoffs is not None else 0,
        "num_kv_handoffs_held": handoffs.num_held if handoffs is not None else 0,
        "num_kv_handoff_blocks_held": handoffs.num_held_blocks if handoffs is not None else 0,
        "num_kv_handoffs_expired": handoffs.num_expired if handoffs is not None else 0,
    }
