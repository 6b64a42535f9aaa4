"""StopChecker: first match, truncation, and hold-back that never leaks a stop string."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import pytest

from ladle.frontend.stop_checker import StopChecker
from ladle.sampling.params import SamplingParams


@dataclass
class StreamOutcome:
    emitted: list[str]
    final_text: str
    stop_string: str | None


def stream_through(checker: StopChecker, deltas: list[str]) -> StreamOutcome:
    """What the front end does: check each delta, stream up to safe_length, stop on a match."""
    text = ""
    emitted: list[str] = []
    num_streamed = 0
    previous_safe_length = 0
    for delta in deltas:
        text += delta
        result = checker.check(text, len(delta))
        assert result.safe_length >= previous_safe_length, "safe_length went backwards"
        max_hold_back = max(checker.max_stop_length - 1, 0)
        assert result.matched or len(text) - result.safe_length <= max_hold_back
        previous_safe_length = result.safe_length
        emitted.append(text[num_streamed:result.safe_length])
        num_streamed = result.safe_length
        if result.matched:
            assert result.truncated_text == text[: result.safe_length]
            return StreamOutcome(emitted, result.truncated_text, result.stop_string)
    result = checker.check(text, 0, is_final=True)
    assert result.safe_length == len(text)
    emitted.append(text[num_streamed:])
    return StreamOutcome(emitted, text, None)


def reference_stop(text: str, stop: list[str], include: bool) -> tuple[str, str | None]:
    """Checks after every character: the stop string that ends first (ties: longest) wins."""
    for end in range(1, len(text) + 1):
        for stop_string in sorted(stop, key=len, reverse=True):
            if text[:end].endswith(stop_string):
                cut = end if include else end - len(stop_string)
                return text[:cut], stop_string
    return text, None


def test_match_inside_one_delta() -> None:
    outcome = stream_through(StopChecker(["END"], False), ["Hello ", "wor ld END tail", "more"])
    assert outcome.final_text == "Hello wor ld "
    assert outcome.stop_string == "END"
    assert "".join(outcome.emitted) == outcome.final_text


def test_match_spanning_deltas_is_never_leaked() -> None:
    outcome = stream_through(StopChecker(["</s>"], False), ["answer <", "/", "s", "> junk"])
    assert outcome.final_text == "answer "
    assert outcome.stop_string == "</s>"
    assert outcome.emitted == ["answer ", "", "", ""]


def test_match_at_start() -> None:
    outcome = stream_through(StopChecker(["STOP"], False), ["STOP", "after"])
    assert outcome.final_text == ""
    assert outcome.stop_string == "STOP"
    assert "".join(outcome.emitted) == ""


def test_include_stop_str_in_output() -> None:
    outcome = stream_through(StopChecker(["</s>"], True), ["answer </", "s> junk"])
    assert outcome.final_text == "answer </s>"
    assert "".join(outcome.emitted) == "answer </s>"


def test_first_stop_to_end_wins_whatever_the_list_order() -> None:
    # "bc" completes before "abcd" does, even though "abcd" starts first.
    for stop in (["abcd", "bc"], ["bc", "abcd"]):
        result = StopChecker(stop, False).check("xxabcd", 6)
        assert (result.stop_string, result.truncated_text) == ("bc", "xxa")
    # Both end at the same character: the longer one wins, so all of it is removed.
    result = StopChecker(["c", "abc"], False).check("xxabcd", 6)
    assert (result.stop_string, result.truncated_text) == ("abc", "xx")
    # Later in the text loses to earlier, regardless of list order.
    result = StopChecker(["zz", "yy"], False).check("..yy..zz", 8)
    assert result.stop_string == "yy"


def test_held_back_prefix_is_released_when_it_is_not_a_stop() -> None:
    checker = StopChecker(["</s>"], False)
    assert checker.check("a </", 4).safe_length == 2
    result = checker.check("a </p> b", 4)
    assert not result.matched and result.safe_length == len("a </p> b")
    outcome = stream_through(checker, ["a </", "p> b <", "/x"])
    assert "".join(outcome.emitted) == "a </p> b </x"


def test_hold_back_only_what_could_start_a_stop() -> None:
    checker = StopChecker(["###", "<|end|>"], False)
    assert checker.check("hello", 5).safe_length == 5
    assert checker.check("hello #", 1).safe_length == 6
    assert checker.check("hello ##", 1).safe_length == 6
    assert checker.check("hello <|en", 3).safe_length == 6
    assert checker.check("hello <|en", 3, is_final=True).safe_length == 10


def test_only_new_text_is_searched() -> None:
    # An old match was seen (and ignored, e.g. under min_tokens) by an earlier call.
    checker = StopChecker(["STOP"], False)
    assert not checker.check("xxSTOPyy", 2).matched
    assert checker.check("xxSTOPyy", 3).matched  # a match ending inside the new text


def test_no_stop_strings_passes_everything_through() -> None:
    outcome = stream_through(StopChecker([], False), ["a", "bc", ""])
    assert outcome.emitted == ["a", "bc", "", ""] and outcome.final_text == "abc"


def test_validation_and_construction() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopChecker(["ok", ""], False)
    with pytest.raises(ValueError, match="num_new_chars"):
        StopChecker(["x"], False).check("abc", 4)
    checker = StopChecker.from_sampling_params(
        SamplingParams(stop="###", include_stop_str_in_output=True)
    )
    assert checker.stop == ["###"] and checker.include_stop_str_in_output


@pytest.mark.parametrize("include", [False, True])
def test_random_streams_match_the_character_by_character_reference(include: bool) -> None:
    rng = random.Random(1234 + include)
    alphabet = "ab</s>#"
    for _ in range(2000):
        stop = [
            "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
            for _ in range(rng.randint(1, 3))
        ]
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        cuts = sorted(rng.sample(range(len(text) + 1), rng.randint(0, min(6, len(text) + 1))))
        deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        outcome = stream_through(StopChecker(stop, include), deltas)
        expected_text, expected_stop = reference_stop(text, stop, include)
        assert (outcome.final_text, outcome.stop_string) == (expected_text, expected_stop)
        streamed = "".join(outcome.emitted)
        assert streamed == outcome.final_text
        if not include:
            assert not any(s in streamed for s in stop)


def test_long_stop_strings_cost_linear_time_and_memory() -> None:
    # Every proper prefix of a 60k-character stop string would be ~1.8e9 characters.
    long_stop = "a" * 60_000
    started = time.perf_counter()
    checker = StopChecker([long_stop, "b" * 5000], False)
    outcome = stream_through(checker, ["a" * 3] * 2000)
    assert time.perf_counter() - started < 5.0
    # Until the end, every character could still be the start of the long stop string.
    assert all(piece == "" for piece in outcome.emitted[:-1])
    assert outcome.final_text == "a" * 6000 and outcome.stop_string is None
    assert checker.check("a" * 6000 + "c", 1).safe_length == 6001
    copy = checker.fresh_copy()
    assert copy.check("aab", 3).safe_length == 2  # "b" may start the second stop string


def test_sampling_params_bound_the_stop_characters() -> None:
    with pytest.raises(ValueError, match="at most 65536 characters"):
        SamplingParams(stop=["x" * 40_000, "y" * 30_000])
