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

from ladle.sampling_params import SamplingParams


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
    """Checks one request's growing output text for stop strings."""

    def __init__(self, stop: Iterable[str], include_stop_str_in_output: bool = False) -> None:
        self.stop = list(dict.fromkeys(stop))
        if not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError("stop must be a list of non-empty strings")
        self.include_stop_str_in_output = include_stop_str_in_output
        self.max_stop_length = max((len(s) for s in self.stop), default=0)
        # Proper prefixes of the stop strings, grouped by their last character and longest first,
        # so the hold-back only tries prefixes that could end where the text ends.
        prefixes_by_last_char: dict[str, set[str]] = {}
        for stop_string in self.stop:
            for length in range(1, len(stop_string)):
                prefix = stop_string[:length]
                prefixes_by_last_char.setdefault(prefix[-1], set()).add(prefix)
        self._prefixes_by_last_char = {
            char: sorted(prefixes, key=len, reverse=True)
            for char, prefixes in prefixes_by_last_char.items()
        }

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
        return StopCheckResult(safe_length=len(text) - self._num_chars_to_hold_back(text))

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

    def _num_chars_to_hold_back(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        if not text:
            return 0
        for prefix in self._prefixes_by_last_char.get(text[-1], ()):
            if text.endswith(prefix):
                return len(prefix)
        return 0
