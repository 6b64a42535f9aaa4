"""Prefix-aware replica choice: the same prompt prefix goes to the same replica, unless it is busy.

A replica that already served a prefix holds its KV blocks in its prefix cache, so sending the
next request with that prefix there turns its prefill into cache hits. The routing key is the
chained hash of the prompt's first few full blocks, computed exactly like the engine's own block
hashes (core/block_hash.py), so "same key" means "the engine would find those blocks cached".

The policy is pure (no Ray): given a key and each replica's queue length, it answers a replica
and why. Ray's request router (request_router.py) feeds it the queue lengths Ray tracks.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence

from ladle.core.block_hash import hash_block_tokens

DEFAULT_PREFIX_BLOCKS = 4
DEFAULT_LOAD_MARGIN = 4
DEFAULT_MAX_TRACKED_PREFIXES = 100_000

# Why a replica was chosen; the labels of the per-replica routing counter in /metrics.
REASON_PREFIX_HIT = "prefix_hit"  # the replica that holds the prefix, within the load margin
REASON_OVERLOADED = "overloaded"  # the owner's queue exceeded the least loaded's by the margin
REASON_NEW_PREFIX = "new_prefix"  # first time this prefix is seen (or its owner is gone)
REASON_NO_PREFIX = "no_prefix"  # prompt shorter than one block: nothing to share


def prefix_routing_key(
    token_ids: Sequence[int], block_size: int, num_prefix_blocks: int = DEFAULT_PREFIX_BLOCKS
) -> int | None:
    """The chained hash of the first `num_prefix_blocks` full blocks of a prompt (fewer when the
    prompt is shorter), or None when it has no full block. Equal to the engine's hash of the last
    of those blocks, so two prompts share a key only if the engine could share those blocks."""
    if block_size < 1 or num_prefix_blocks < 1:
        raise ValueError(
            f"block_size and num_prefix_blocks must be >= 1, got {block_size}, {num_prefix_blocks}"
        )
    num_blocks = min(num_prefix_blocks, len(token_ids) // block_size)
    key: int | None = None
    for block in range(num_blocks):
        start = block * block_size
        key = hash_block_tokens(key, tuple(token_ids[start : start + block_size]))
    return key


@dataclasses.dataclass(frozen=True)
class RoutingDecision:
    replica: Hashable
    reason: str


class PrefixAwarePolicy:
    """Chooses a replica per request from its prefix key and the replicas' queue lengths.

    - A key seen before goes to the replica that first served it (its owner), unless the owner's
      queue is longer than the least loaded replica's by more than `load_margin`; then the least
      loaded takes it (the owner stays the owner: the spill is temporary, the cache is not).
    - A new key (or one whose owner left) goes to its rendezvous-hash winner among the replicas
      within `load_margin` of the least loaded: of those, the one with the highest
      hash(key, replica). Distinct prefixes spread evenly over replicas, and every front process
      (each has its own policy: `ladle serve --api-server-count`) that sees a key first picks the
      same owner for it without talking to the others, unless their loads differ past the margin.
    - No key: the least loaded replica.
    The owner table keeps the `max_tracked_prefixes` most recently used keys (LRU).
    """

    def __init__(
        self,
        load_margin: int = DEFAULT_LOAD_MARGIN,
        max_tracked_prefixes: int = DEFAULT_MAX_TRACKED_PREFIXES,
    ) -> None:
        if load_margin < 0:
            raise ValueError(f"load_margin must be >= 0, got {load_margin}")
        if max_tracked_prefixes < 1:
            raise ValueError(f"max_tracked_prefixes must be >= 1, got {max_tracked_prefixes}")
        self.load_margin = load_margin
        self.max_tracked_prefixes = max_tracked_prefixes
        self._owners: OrderedDict[int, Hashable] = OrderedDict()

    def owner_of(self, key: int) -> Hashable | None:
        return self._owners.get(key)

    def choose(self, key: int | None, queue_lengths: Mapping[Hashable, int]) -> RoutingDecision:
        """queue_lengths: every replica that may take the request -> its ongoing requests."""
        if not queue_lengths:
            raise ValueError("no replica to route to")
        least_loaded = min(
            queue_lengths, key=lambda replica: (queue_lengths[replica], str(replica))
        )
        if key is None:
            return RoutingDecision(least_loaded, REASON_NO_PREFIX)
        owner = self._owners.get(key)
        if owner is not None and owner in queue_lengths:
            self._owners.move_to_end(key)
            if queue_lengths[owner] - queue_lengths[least_loaded] > self.load_margin:
                return RoutingDecision(least_loaded, REASON_OVERLOADED)
            return RoutingDecision(owner, REASON_PREFIX_HIT)
        least_load = queue_lengths[least_loaded]
        owner = max(
            (r for r in queue_lengths if queue_lengths[r] - least_load <= self.load_margin),
            key=lambda replica: rendezvous_weight(key, replica),
        )
        self._owners.pop(key, None)
        self._owners[key] = owner
        while len(self._owners) > self.max_tracked_prefixes:
            self._owners.popitem(last=False)
        return RoutingDecision(owner, REASON_NEW_PREFIX)

    def forget_replica(self, replica: Hashable) -> None:
        """Drop a replica that died or was scaled away: its prefixes find new owners."""
        for key in [key for key, owner in self._owners.items() if owner == replica]:
            del self._owners[key]


def rendezvous_weight(key: int, replica: Hashable) -> int:
    """hash(key, replica), the same in every process (no per-process salt, unlike hash())."""
    digest = hashlib.blake2b(f"{key}/{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
