"""Grammar compilation off the engine loop, and the per-request matcher state.

GrammarCompiler builds llguidance's tokenizer view once (lazily: an engine that never sees a
constrained request never pays its ~0.7 s) and compiles grammars on a worker thread, cached by
grammar text: a second request with the same schema starts from a copy of the compiled matcher.
llguidance drops the GIL while it compiles, so the engine loop keeps stepping meanwhile.

RequestGrammar is one request's matcher: it consumes each sampled token, can roll tokens back
(for speculative decoding), and for reasoning models stays inactive until the reasoning ends.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import llguidance

    from ladle.model.tokenizer import TextTokenizer

logger = logging.getLogger(__name__)

GRAMMAR_CACHE_SIZE = 256


class GrammarCompiler:
    """Compiles llguidance grammars for one tokenizer on a worker thread, cached by grammar."""

    def __init__(
        self,
        load_tokenizer: Callable[[], TextTokenizer],
        vocab_size: int,
        cache_size: int = GRAMMAR_CACHE_SIZE,
    ) -> None:
        self._load_tokenizer = load_tokenizer
        self.vocab_size = vocab_size
        self._cache_size = cache_size
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ladle-grammar")

    def submit(self, grammar: str) -> Future:
        """A future of the compiled (never consumed) matcher; copy it per request."""
        with self._lock:
            future = self._cache.get(grammar)
            if future is not None:
                self._cache.move_to_end(grammar)
                return future
            future = self._executor.submit(self._compile, grammar)
            self._cache[grammar] = future
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        # A failed compile is not kept: the same grammar may be asked for again and fail again,
        # cheaply, rather than pin an error in the cache.
        future.add_done_callback(lambda done: self._forget_failure(grammar, done))
        return future

    def _forget_failure(self, grammar: str, future: Future) -> None:
        if future.exception() is not None:
            with self._lock:
                if self._cache.get(grammar) is future:
                    del self._cache[grammar]

    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:
            import llguidance.hf

            tokenizer = self._load_tokenizer()
            # End ids from the model's config may lie past the tokenizer's own vocabulary.
            num_tokenizer_ids = len(tokenizer.hf_tokenizer)
            eos = [t for t in tokenizer.eos_token_ids if t < num_tokenizer_ids]
            self._ll_tokenizer = llguidance.hf.from_tokenizer(
                tokenizer.hf_tokenizer, n_vocab=self.vocab_size, eos_token=eos[0] if eos else None
            )
        return self._ll_tokenizer

    def _compile(self, grammar: str) -> llguidance.LLMatcher:
        import llguidance

        matcher = llguidance.LLMatcher(self.ll_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"the grammar does not compile: {matcher.get_error()}")
        return matcher

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


# What became of each accepted token, for rollback.
_BEFORE_GATE = 0  # output before the reasoning ended: not the grammar's business
_CONSUMED = 1  # the matcher consumed it
_SKIPPED = 2  # the matcher was stopped (only the end token can follow) or in error


class RequestGrammar:
    """One request's grammar state. Inactive (no mask) until reasoning_end_token_ids appear in
    the output, when given; then every token goes through the matcher.

    Accepting is split in two (`wants_matcher`, then the matcher's consume, then
    `record_consumed`) so the manager can advance many requests in one batched llguidance call.
    """

    def __init__(
        self, matcher: llguidance.LLMatcher, reasoning_end_token_ids: list[int] | None = None
    ) -> None:
        self.matcher = matcher
        self._reasoning_end = tuple(reasoning_end_token_ids or ())
        self.is_active = not self._reasoning_end
        self._history: list[int] = []  # one of the kinds above per accepted token
        self._before_gate: list[int] = []  # the tokens before the reasoning ended

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False if the grammar rejects it (the matcher then stays
        in its error state and the request continues unconstrained)."""
        if self.wants_matcher(token_id):
            return self.record_consumed(token_id, self.matcher.consume_token(token_id))
        return not self.matcher.is_error()

    def wants_matcher(self, token_id: int) -> bool:
        """The first half of accepting token_id: the bookkeeping, and whether the matcher must
        consume it (the caller then does, alone or batched, and calls record_consumed)."""
        if not self.is_active:
            self._history.append(_BEFORE_GATE)
            self._before_gate.append(token_id)
            if tuple(self._before_gate[-len(self._reasoning_end) :]) == self._reasoning_end:
                self.is_active = True
            return False
        # A stopped matcher (a complete value) only sees the end token, which llguidance does not
        # keep in its history: consuming it would make a later rollback undo a real token.
        if self.matcher.is_error() or self.matcher.is_stopped():
            self._history.append(_SKIPPED)
            return False
        self._history.append(_CONSUMED)
        return True

    def record_consumed(self, token_id: int, accepted: bool) -> bool:
        """The second half: what the matcher said about token_id."""
        if not accepted:
            logger.warning("grammar rejected token %d: %s", token_id, self.matcher.get_error())
        return accepted

    def rollback(self, num_tokens: int) -> None:
        """Forget the last num_tokens accepted tokens (rejected speculative tokens)."""
        if num_tokens <= 0:
            return
        if num_tokens > len(self._history):
            raise ValueError(
                f"cannot roll back {num_tokens} tokens: only {len(self._history)} were accepted"
            )
        dropped = self._history[-num_tokens:]
        del self._history[-num_tokens:]
        num_consumed = dropped.count(_CONSUMED)
        if num_consumed:
            self.matcher.rollback(num_consumed)
        num_before_gate = dropped.count(_BEFORE_GATE)
        if num_before_gate:
            del self._before_gate[-num_before_gate:]
            # Only tokens before the gate remain: it is open again only if they still end it.
            self.is_active = (
                tuple(self._before_gate[-len(self._reasoning_end) :]) == self._reasoning_end
            )

    @property
    def needs_mask(self) -> bool:
        return self.is_active and not self.matcher.is_error()
