"""Suffix drafting: match the request's latest tokens against its own prompt and output and
against the outputs of earlier requests, and propose what followed.

The idea is suffix decoding's (Oliaro et al., "SuffixDecoding", 2024; in vLLM through Snowflake's
arctic-inference): agentic and code-editing traffic repeats itself, within a request (an edit
copies most of the text it was given) and across requests (the same tool calls, the same
boilerplate), so a cheap index over tokens already seen predicts long runs. ladle's form, built
for a per-request, per-step host budget of a few microseconds:

- Within the request: an NgramIndex (ngram.py) over prompt + output, the latest occurrence of the
  longest matching suffix, continued for as many tokens as it goes.
- Across requests: a bounded global table over the outputs of the last max_cached_requests
  requests that ended: for each context of n tokens (n in [min_n, max_n], the context hashed to
  one int), how often each next token followed it. Drafting walks it greedily: the longest
  context that matches, its most frequent next token while that token's share is at least
  min_token_share, then again from the extended context. Evicting a request subtracts its counts,
  so the table holds exactly the cached requests' outputs.
- The longer match wins (the request's own on a tie), and a draft runs at most
  max_spec_factor times the match length: a 2-token match is weak evidence for 8 tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from ladle.spec_decode.ngram import NgramIndex

# Cap on the output tokens one ended request adds to the global table (memory: about
# (max_n - min_n + 1) dict entries per token).
MAX_INDEXED_OUTPUT_TOKENS = 4096


class GlobalSuffixTable:
    """Next-token counts after every context of min_n..max_n tokens in the cached outputs."""

    def __init__(self, min_n: int, max_n: int, max_cached_requests: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.max_cached_requests = max_cached_requests
        self.next_counts: dict[int, dict[int, int]] = {}
        self._cached: deque[list[tuple[int, int]]] = deque()  # each request's (context, next)

    def add(self, output_token_ids: Sequence[int]) -> None:
        tokens = list(output_token_ids[:MAX_INDEXED_OUTPUT_TOKENS])
        entries = []
        for end in range(self.min_n, len(tokens)):
            following = tokens[end]
            for n in range(self.min_n, min(self.max_n, end) + 1):
                context = hash(tuple(tokens[end - n : end]))
                counts = self.next_counts.setdefault(context, {})
                counts[following] = counts.get(following, 0) + 1
                entries.append((context, following))
        self._cached.append(entries)
        while len(self._cached) > self.max_cached_requests:
            self._evict(self._cached.popleft())

    def _evict(self, entries: list[tuple[int, int]]) -> None:
        for context, following in entries:
            counts = self.next_counts[context]
            counts[following] -= 1
            if counts[following] == 0:
                del counts[following]
                if not counts:
                    del self.next_counts[context]

    def walk(
        self, tokens: Sequence[int], max_num_tokens: int, min_token_share: float
    ) -> tuple[list[int], int]:
        """(draft, length of the context that matched first) by the greedy walk."""
        if not self.next_counts:
            return [], 0
        context = list(tokens[-self.max_n :])
        draft: list[int] = []
        first_match = 0
        while len(draft) < max_num_tokens:
            best = None
            for n in range(min(self.max_n, len(context)), self.min_n - 1, -1):
                counts = self.next_counts.get(hash(tuple(context[-n:])))
                if counts:
                    best = counts, n
                    break
            if best is None:
                break
            counts, n = best
            token, count = max(counts.items(), key=lambda item: item[1])
            if count < min_token_share * sum(counts.values()):
                break
            if not draft:
                first_match = n
            draft.append(token)
            context.append(token)
            del context[: len(context) - self.max_n]
        return draft, first_match


class SuffixProposer:
    """Drafts from the request's own tokens and from earlier requests' outputs (see above)."""

    def __init__(
        self,
        min_n: int,
        max_n: int,
        max_cached_requests: int,
        max_spec_factor: float = 2.0,
        min_token_share: float = 0.3,
    ) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self.max_spec_factor = max_spec_factor
        self.min_token_share = min_token_share
        self.indexes: dict[str, NgramIndex] = {}
        self.table = GlobalSuffixTable(min_n, max_n, max_cached_requests)

    def propose_from(
        self, request_id: str, tokens: Sequence[int], max_num_tokens: int
    ) -> list[int]:
        index = self.indexes.get(request_id)
        if index is None:
            index = self.indexes[request_id] = NgramIndex(self.min_n, self.max_n)
        own, own_match = index.lookup_with_length(tokens, max_num_tokens)
        shared, shared_match = self.table.walk(tokens, max_num_tokens, self.min_token_share)
        draft, match = (own, own_match) if own_match >= shared_match else (shared, shared_match)
        return draft[: max(1, int(self.max_spec_factor * match))] if draft else []

    def forget_history(self) -> None:
        """Empty the global table (benchmarks that repeat their requests)."""
        self.table = GlobalSuffixTable(
            self.table.min_n, self.table.max_n, self.table.max_cached_requests
        )

    def release(self, request_id: str, output_token_ids: Sequence[int]) -> None:
        """A request ended: its index goes, its output joins the global table."""
        self.indexes.pop(request_id, None)
        if output_token_ids:
            self.table.add(output_token_ids)
