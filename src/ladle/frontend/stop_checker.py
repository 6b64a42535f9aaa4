"""Stop strings over streamed text: find the first match, and hold back what could start one.

Per step the front end does:

    delta = detokenizer.add_tokens(new_token_ids)
    result = stop_checker.check(detokenizer.text, len(delta))
    stream detokenizer.text[num_streamed:result.safe_length]
    if result.matched: finish with result.truncated_text and abort the request

and when the request finishes for another reason (EOS, max_tokens):

    delta = detokenizer.flush()
    result = stop_checker.check(detokenizer.text, len(delta), is_final=True)

A match can only end inside the new text (any earlier one was found by an earlier call), so
each call searches only the delta plus the longest stop string's length before it. The first
stop string to *end* wins, exactly as if the text were checked after every character, so the
result does not depend on how the text was split into deltas.

While streaming, a tail of the text that is a prefix of some stop string ("</" for "</s>") is
held back: if the stop string completes, that tail must never have been sent. The safe length
never decreases, so what has been streamed is always a prefix of the final text.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ladle.sampling.params import SamplingParams


@dataclass(frozen=True)
class StopCheckResult:
    """What one check found.

    safe_length: text[:safe_length] is final and may be streamed. After a match it is the
        length of the truncated text.
    stop_string: the stop string that matched, or None.
    truncated_text: the final output text after a match (stop string kept only when
        include_stop_str_in_output), else None.
    """

    safe_length: int
    stop_string: str | None = None
    truncated_text: str | None = None

    @property
    def matched(self) -> bool:
        return self.stop_string is not None


class StopChecker:
    """Checks one request's growing output text for stop strings.

    The hold-back is the longest tail of the text that is a proper prefix of a stop string. Each
    stop string keeps a Knuth-Morris-Pratt state (the length of its longest prefix that the text
    ends with), fed only the new characters, so a call costs O(new characters x stop strings) and
    memory stays linear in the stop strings' length. A call whose text does not continue the
    last one recomputes the states from the text's tail.
    """

    def __init__(
        self,
        stop: Iterable[str],
        include_stop_str_in_output: bool = False,
        _failures: list[list[int]] | None = None,
    ) -> None:
        self.stop = list(dict.fromkeys(stop))
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a list of non-empty strings")
        self.include_stop_str_in_output = include_stop_str_in_output
        self.max_stop_length = max((len(s) for s in self.stop), default=0)
        self._failures = _failures or [_failure_function(s) for s in self.stop]
        self._states = [0] * len(self.stop)
        self._num_chars_fed = 0

    def fresh_copy(self) -> StopChecker:
        """A checker for another sample of the same request: the same stop strings and tables
        (built once), its own states."""
        return StopChecker(self.stop, self.include_stop_str_in_output, self._failures)

    @classmethod
    def from_sampling_params(cls, params: SamplingParams) -> StopChecker:
        return cls(params.stop or [], params.include_stop_str_in_output)

    def check(self, text: str, num_new_chars: int, is_final: bool = False) -> StopCheckResult:
        """Checks `text`, whose last `num_new_chars` characters are new since the last call.

        `is_final`: no more text will come (the request finished for another reason), so nothing
        needs holding back.
        """
        if not 0 <= num_new_chars <= len(text):
            raise ValueError(f"num_new_chars must be in [0, {len(text)}], got {num_new_chars}")
        if not self.stop:
            return StopCheckResult(safe_length=len(text))
        if num_new_chars:
            match = self._find_first_match(text, num_new_chars)
            if match is not None:
                start, stop_string = match
                end = start + len(stop_string) if self.include_stop_str_in_output else start
                return StopCheckResult(end, stop_string, text[:end])
        if is_final:
            return StopCheckResult(safe_length=len(text))
        held_back = self._num_chars_to_hold_back(text, num_new_chars)
        return StopCheckResult(safe_length=len(text) - held_back)

    def _find_first_match(self, text: str, num_new_chars: int) -> tuple[int, str] | None:
        """The (start, stop string) of the match ending first in the new text; ties: longest."""
        old_length = len(text) - num_new_chars
        best: tuple[int, int, str] | None = None  # (end, start, stop string)
        for stop_string in self.stop:
            # The earliest start that would end inside the new text.
            start = text.find(stop_string, max(0, old_length - len(stop_string) + 1))
            if start < 0:
                continue
            candidate = (start + len(stop_string), start, stop_string)
            if best is None or candidate[:2] < best[:2]:
                best = candidate
        return None if best is None else (best[1], best[2])

    def _num_chars_to_hold_back(self, text: str, num_new_chars: int) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        self._feed(text, num_new_chars)
        longest = 0
        for stop_string, failure, state in zip(self.stop, self._failures, self._states):
            if state == len(stop_string):  # a whole (old, already judged) match ends here
                state = failure[state - 1]
            longest = max(longest, state)
        return longest

    def _feed(self, text: str, num_new_chars: int) -> None:
        """Advance every stop string's KMP state over the text not fed yet."""
        start = self._num_chars_fed
        if len(text) - num_new_chars != start:  # not what was fed plus the new characters:
            # start over from the only tail that can matter
            self._states = [0] * len(self.stop)
            start = max(0, len(text) - self.max_stop_length)
        new_text = text[start:]
        for index, (stop_string, failure) in enumerate(zip(self.stop, self._failures)):
            state = self._states[index]
            length = len(stop_string)
            for char in new_text:
                while state and (state == length or stop_string[state] != char):
                    state = failure[state - 1]
                if stop_string[state] == char:
                    state += 1
            self._states[index] = state
        self._num_chars_fed = len(text)


def _failure_function(pattern: str) -> list[int]:
    """failure[i]: the length of the longest proper prefix of pattern[:i + 1] that is also its
    suffix (the KMP prefix function)."""
    failure = [0] * len(pattern)
    state = 0
    for index in range(1, len(pattern)):
        while state and pattern[index] != pattern[state]:
            state = failure[state - 1]
        if pattern[index] == pattern[state]:
            state += 1
        failure[index] = state
    return failure
