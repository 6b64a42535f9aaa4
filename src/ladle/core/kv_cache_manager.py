"""KVCacheManager: which KV blocks each request holds, and prefix-cache lookups.

The manager says no, the scheduler decides: allocate_slots returns None when the pool cannot
supply the blocks, changing nothing, and the scheduler preempts or waits. The life of a request:

    blocks, num_hit = manager.get_computed_blocks(request)        # waiting request, no blocks yet
    manager.allocate_slots(request, num_new_tokens, blocks, num_hit)
    ... the step runs; the scheduler advances request.num_computed_tokens ...
    manager.cache_computed_blocks(request)                        # full, computed blocks -> cache
    manager.allocate_slots(request, 1)                             # each later decode step
    manager.free(request)                                          # finished, aborted or preempted

With a host tier (host_tier.py), cached blocks are written back to the host as they near
eviction from the device pool (kv_transfers.py: a look-ahead over the free queue, so nothing is
copied while nothing is evicted), and a waiting request whose prefix continues on the host after
its device hits is loaded first (find_host_hits, start_load); the scheduler parks it in
WAITING_FOR_KV until the worker reports the copy done (finish_transfers), then looks it up
again: its prefix is now a device hit. The copies travel in the plan (take_kv_operations).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ladle.core.block_hash import extend_block_hashes
from ladle.core.block_pool import BlockPool, KVBlock
from ladle.core.host_tier import HostBlock, HostTier
from ladle.core.kv_transfers import FinishedLoads, KVTransfers
from ladle.protocol.step import KVOperation

if TYPE_CHECKING:
    from ladle.core.request import Request


class KVCacheManager:
    """Per-request block tables over one BlockPool, with prefix caching."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        num_host_blocks: int = 0,
        write_back_window: int | None = None,
    ) -> None:
        """write_back_window: blocks ahead of the free queue's head whose cached KV is written
        to the host tier (kv_transfers.py); at least what one step may allocate. None: the
        whole pool (every freed cached block is written back at the next plan)."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        if num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {num_host_blocks}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        # The host tier works through the prefix cache's hashes: without caching it is off.
        self.host_tier: HostTier | None = None
        self.transfers: KVTransfers | None = None
        if num_host_blocks and enable_caching:
            self.host_tier = HostTier(num_host_blocks)
            self.transfers = KVTransfers(self.block_pool, self.host_tier, write_back_window)
        # Tokens looked up on the host tier (those after the device hits), and those found there
        # and loaded.
        self.host_cache_queries = 0
        self.host_cache_hits = 0
        self._blocks_by_request: dict[str, list[KVBlock]] = {}
        # How many leading blocks of each request are already in the hash map, so that
        # cache_computed_blocks only looks at the blocks completed since its last call.
        self._num_cached_blocks_by_request: dict[str, int] = {}
        # Tokens looked up / tokens found, for the hit-rate metric. Counted on every
        # get_computed_blocks call, so a request that is looked up again after failing to get
        # blocks (or after preemption) counts again.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of usable blocks held by requests, in [0, 1]."""
        return self.block_pool.usage

    def num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks that num_tokens tokens occupy."""
        return -(-num_tokens // self.block_size)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table; [] for a request that holds no blocks."""
        return [block.block_id for block in self._blocks_by_request.get(request_id, ())]

    def get_block_ids_from(self, request_id: str, start: int) -> list[int]:
        """The request's block ids from index start of its table on."""
        blocks = self._blocks_by_request.get(request_id, ())
        return [block.block_id for block in blocks[start:]]

    def num_blocks_of(self, request_id: str) -> int:
        return len(self._blocks_by_request.get(request_id, ()))

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest run of the request's leading full blocks already in the prefix cache.

        Returns (blocks, num_tokens_hit) without taking references: pass both to allocate_slots.
        Stops short of the last token, even on a fully cached prompt, so that at least one token
        is computed and yields the logits of the next token. Meant for a request holding no
        blocks (new, or preempted and reset to num_computed_tokens 0).
        """
        if not self.enable_caching:
            return [], 0
        if request.sampling_params.prompt_logprobs is not None:
            # Prompt logprobs need every prompt position's hidden state: compute them all,
            # as vLLM does. The request's blocks are still cached for others.
            return [], 0
        extend_block_hashes(request, self.block_size)
        max_hit_blocks = max(0, (request.num_tokens - 1) // self.block_size)
        hit_blocks: list[KVBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break  # hashes chain, so nothing after a miss can hit
            hit_blocks.append(block)
        num_tokens_hit = len(hit_blocks) * self.block_size
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += num_tokens_hit
        if self.host_tier is not None:
            # A device hit is a use of the hash in either tier: the host's LRU follows it.
            for block in hit_blocks:
                assert block.block_hash is not None
                self.host_tier.touch(block.block_hash)
        return hit_blocks, num_tokens_hit

    @property
    def has_host_tier(self) -> bool:
        return self.host_tier is not None

    def find_host_hits(self, request: Request, num_device_hit_blocks: int) -> list[HostBlock]:
        """The host blocks that continue the request's prefix after its device hits (call
        after get_computed_blocks). Same cap: the last token is always computed."""
        if self.host_tier is None or request.sampling_params.prompt_logprobs is not None:
            return []
        max_hit_blocks = max(0, (request.num_tokens - 1) // self.block_size)
        hits: list[HostBlock] = []
        for block_hash in request.block_hashes[num_device_hit_blocks:max_hit_blocks]:
            block = self.host_tier.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        self.host_cache_queries += request.num_tokens - num_device_hit_blocks * self.block_size
        return hits

    def start_load(
        self, request: Request, device_hits: list[KVBlock], host_hits: list[HostBlock]
    ) -> bool:
        """Give the request its device hits plus fresh blocks for its host hits and order the
        load. False, changing nothing, when the pool lacks the fresh blocks."""
        assert self.transfers is not None
        if request.request_id in self._blocks_by_request:
            raise ValueError(f"request {request.request_id} already holds blocks; no load")
        num_revived = sum(1 for block in device_hits if block.ref_count == 0)
        if len(host_hits) > self.block_pool.num_free_blocks - num_revived:
            return False
        self.block_pool.touch(device_hits)
        fresh = self.block_pool.get_new_blocks(len(host_hits))
        self._blocks_by_request[request.request_id] = [*device_hits, *fresh]
        self._num_cached_blocks_by_request[request.request_id] = len(device_hits)
        self.transfers.load(request.request_id, fresh, host_hits)
        # Counted when loaded, not when found: a lookup repeats while the pool has no room.
        self.host_cache_hits += len(host_hits) * self.block_size
        return True

    def take_kv_operations(self) -> list[KVOperation]:
        """The copies ordered since the last plan (none without a host tier)."""
        return self.transfers.take_operations() if self.transfers is not None else []

    def finish_transfers(self, done_ids: list[int], failed: dict[int, str]) -> FinishedLoads:
        """Settle the copies a step reports. A loaded request's blocks are released at once,
        now cached on the device, so the scheduler can look it up again like any other."""
        if self.transfers is None or not (done_ids or failed):
            return FinishedLoads()
        finished = self.transfers.finish(done_ids, failed)
        for request_id in [*finished.loaded, *finished.failed]:
            self._release_blocks(request_id)
        return finished

    def cancel_load(self, request: Request) -> None:
        """An aborted request that waits for its load: unpin the host, free its blocks."""
        if self.transfers is not None:
            self.transfers.cancel_load(request.request_id)
        self.free(request)

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVBlock] | None = None,
        num_new_computed_tokens: int = 0,
    ) -> list[KVBlock] | None:
        """Make the request hold blocks for all of its computed, hit and new tokens.

        That is num_computed_tokens + num_new_computed_tokens + num_new_tokens tokens.
        new_computed_blocks are the prefix hits from get_computed_blocks: they are referenced and
        become the head of the block table. Returns the newly allocated blocks (possibly []), or
        None, with nothing changed, when the free blocks do not suffice.
        """
        if num_new_tokens < 0:
            raise ValueError(f"num_new_tokens must be >= 0, got {num_new_tokens}")
        new_computed_blocks = new_computed_blocks or []
        if num_new_computed_tokens > len(new_computed_blocks) * self.block_size:
            raise ValueError(
                f"{num_new_computed_tokens} computed tokens do not fit in "
                f"{len(new_computed_blocks)} computed blocks"
            )
        request_blocks = self._blocks_by_request.get(request.request_id, [])
        if new_computed_blocks and request_blocks:
            # Prefix hits cover the start of the sequence; a request with blocks already has one.
            raise ValueError(f"request {request.request_id} already holds blocks; no prefix hits")

        num_total_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_blocks_to_allocate = max(
            0,
            self.num_blocks_needed(num_total_tokens)
            - len(request_blocks)
            - len(new_computed_blocks),
        )
        # A hit on a free cached block takes it out of the free queue, so it is not there to be
        # allocated as well.
        num_revived = sum(1 for block in new_computed_blocks if block.ref_count == 0)
        if num_blocks_to_allocate > self.block_pool.num_free_blocks - num_revived:
            return None

        # Touch before allocating: otherwise get_new_blocks could evict the very blocks just hit.
        self.block_pool.touch(new_computed_blocks)
        # Most decode steps need no new block: nothing to take from the free queue then.
        new_blocks = (
            self.block_pool.get_new_blocks(num_blocks_to_allocate) if num_blocks_to_allocate else []
        )
        request_blocks = self._blocks_by_request.setdefault(request.request_id, [])
        request_blocks.extend(new_computed_blocks)
        request_blocks.extend(new_blocks)
        if new_computed_blocks:
            self._num_cached_blocks_by_request[request.request_id] = len(new_computed_blocks)
        return new_blocks

    def cache_computed_blocks(self, request: Request) -> None:
        """Enter the request's full, computed blocks into the prefix cache.

        Called after each step, once request.num_computed_tokens has advanced. The only way
        blocks enter the hash map: a block whose KV is not all written must never be a hit.
        """
        if not self.enable_caching:
            return
        request_blocks = self._blocks_by_request.get(request.request_id)
        if not request_blocks:
            return
        extend_block_hashes(request, self.block_size)
        num_full_computed_blocks = min(
            request.num_computed_tokens // self.block_size,
            len(request_blocks),
            len(request.block_hashes),
        )
        num_cached_blocks = self._num_cached_blocks_by_request.get(request.request_id, 0)
        if num_full_computed_blocks <= num_cached_blocks:
            return
        self.block_pool.cache_full_blocks(
            request, request_blocks, num_cached_blocks, num_full_computed_blocks
        )
        self._num_cached_blocks_by_request[request.request_id] = num_full_computed_blocks

    def trim(self, request: Request, num_tokens: int) -> None:
        """Free the blocks past the first num_tokens tokens' (drafts a step rejected). They
        were never full and computed, so none of them is in the prefix cache."""
        request_blocks = self._blocks_by_request.get(request.request_id)
        if not request_blocks:
            return
        keep = self.num_blocks_needed(num_tokens)
        if len(request_blocks) > keep:
            surplus = request_blocks[keep:]
            del request_blocks[keep:]
            self.block_pool.free_blocks(reversed(surplus))

    def detach(self, request: Request) -> list[KVBlock]:
        """Take the request's blocks away from it without freeing them (a producer holds them
        for a consumer, core/kv_handoff.py); the caller frees them later."""
        self._num_cached_blocks_by_request.pop(request.request_id, None)
        return self._blocks_by_request.pop(request.request_id, [])

    def blocks_of(self, request_id: str) -> list[KVBlock]:
        return list(self._blocks_by_request.get(request_id, ()))

    def free(self, request: Request, write_back: bool = True) -> None:
        """Release the request's blocks and forget it. A no-op for an unknown request.

        Blocks are freed tail first: the tail is the least likely to be shared, so it should be
        the first to be evicted, while the shared prefix stays cached the longest.
        write_back=False (a preempted request that recomputes): the blocks this frees are not
        written to the host tier as they are evicted; they stay device prefix hits meanwhile.
        """
        request_blocks = self._blocks_by_request.get(request.request_id, ())
        self._release_blocks(request.request_id)
        if not write_back and self.transfers is not None:
            for block in request_blocks:
                if block.ref_count == 0 and block.block_hash is not None:
                    block.skip_write_back = True

    def _release_blocks(self, request_id: str) -> None:
        request_blocks = self._blocks_by_request.pop(request_id, None)
        self._num_cached_blocks_by_request.pop(request_id, None)
        if request_blocks:
            self.block_pool.free_blocks(reversed(request_blocks))

    @property
    def host_usage(self) -> float:
        """Fraction of the host tier's blocks holding KV (0 without a host tier)."""
        return self.host_tier.usage if self.host_tier is not None else 0.0

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block in both tiers; False (nothing done) while any request
        holds blocks or a copy is in flight."""
        if self.transfers is not None and self.transfers.num_in_flight:
            return False
        if not self.block_pool.reset_prefix_cache():
            return False
        return self.host_tier.reset() if self.host_tier is not None else True
