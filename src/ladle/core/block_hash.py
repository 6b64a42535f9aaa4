"""Chained block hashes: the keys of the prefix cache.

A block's hash covers its parent's hash, its own token ids and any extra keys, so two blocks with
the same tokens after different prefixes never collide: a hit on block i implies the whole prefix
up to block i matched. Only full blocks get a hash; a partial block's content can still change.

The hashes must agree across processes (the API process and the engine core, a restarted engine),
so Python's per-process salted `hash()` is out: a 64-bit BLAKE2b digest of a fixed byte encoding.
"""

from __future__ import annotations

import hashlib
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ladle.core.request import Request

# 64 bits keeps dict keys small ints; with ~1e6 cached blocks the chance of any collision is ~1e-8.
_DIGEST_SIZE = 8
# Extra keys are encoded through repr(), which is stable across processes only for these types.
_STABLE_KEY_TYPES = (str, int, bytes, bool, type(None))


def hash_block_tokens(
    parent_hash: int | None, token_ids: tuple[int, ...], extra_keys: tuple | None = None
) -> int:
    """The hash of one full block, chained on its parent's (None for a request's first block).

    extra_keys (strings, ints, bytes, or tuples of these) separate blocks that hold the same tokens
    but must not share KV, e.g. a cache salt. The result is an unsigned 64-bit int.
    """
    # A marker byte plus a length prefix keep the encoding unambiguous: no (parent, tokens, extras)
    # triple can produce the same bytes as another.
    parts = [b"\x00" if parent_hash is None else b"\x01" + parent_hash.to_bytes(8, "little")]
    parts.append(struct.pack(f"<I{len(token_ids)}q", len(token_ids), *token_ids))
    if extra_keys:
        _check_stable_keys(extra_keys)
        parts.append(repr(extra_keys).encode())
    digest = hashlib.blake2b(b"".join(parts), digest_size=_DIGEST_SIZE).digest()
    return int.from_bytes(digest, "little")


def request_extra_keys(request: Request) -> tuple | None:
    """The extra keys folded into every block hash of this request."""
    # Put on every block, not only the first: chaining would suffice, but this way a block's hash
    # alone says which salt it belongs to, at the cost of a few bytes hashed.
    return None if request.cache_salt is None else (request.cache_salt,)


def extend_block_hashes(request: Request, block_size: int) -> None:
    """Append to request.block_hashes the hashes of its full blocks that do not have one yet.

    Covers request.all_token_ids (prompt and outputs); the trailing partial block gets no hash.
    Idempotent: calling it again without new tokens adds nothing.
    """
    num_full_blocks = request.num_tokens // block_size
    hashes = request.block_hashes
    if len(hashes) >= num_full_blocks:
        return  # asked every step; a block fills once every block_size tokens
    extra_keys = request_extra_keys(request)
    parent_hash = hashes[-1] if hashes else None
    for block_index in range(len(hashes), num_full_blocks):
        start = block_index * block_size
        token_ids = tuple(request.all_token_ids[start : start + block_size])
        parent_hash = hash_block_tokens(parent_hash, token_ids, extra_keys)
        hashes.append(parent_hash)


def _check_stable_keys(keys: tuple) -> None:
    for key in keys:
        if isinstance(key, tuple):
            _check_stable_keys(key)
        elif not isinstance(key, _STABLE_KEY_TYPES):
            raise TypeError(
                f"block hash extra key {key!r} of type {type(key).__name__} has no stable "
                "encoding; use str, int, bytes or tuples of these"
            )
