"""A pipeline stage before the last writes each request's next input token from the last
stage's shared rows: one row a request for plain decodes, and for a step that verified drafts
the token verification emitted last (the refusing row's, or the bonus row's), not the last row."""

from __future__ import annotations

import torch

from ladle.sample.rejection import emitted_tokens
from ladle.worker.shared_samples import DraftedRows, SharedSamples


class _Done:
    def is_completed(self) -> bool:
        return True

    def wait(self) -> None:
        return None


def _apply(rows, drafts, row_tokens, row_slots, num_slots=8, drafted=True):
    samples = SharedSamples(torch.device("cpu"))
    last_sampled = torch.full((num_slots,), -7, dtype=torch.int64)
    samples.add(
        frozenset({"a", "b", "c"}), _Done(), torch.tensor(row_tokens), torch.tensor(row_slots),
        DraftedRows(rows, drafts) if drafted else None,
    )
    samples.apply_before(["a"], last_sampled)
    return last_sampled.tolist()


def test_a_verify_step_leaves_the_last_emitted_token():
    # Request 0 (slot 5) drafted [10, 11, 12]: rows say 10, 99, ... -> accepts 10, emits 99.
    # Request 1 (slot 2) drafted [20]: rows 20, 21 -> accepts 20, emits the bonus 21.
    # Request 2 (slot 6) drafted nothing: its one row, 30.
    rows = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0)]
    drafts = [[10, 11, 12], [20], []]
    tokens = [10, 99, 12, 13, 20, 21, 30]
    slots = [5, 5, 5, 5, 2, 2, 6]
    emitted = emitted_tokens(tokens, rows, drafts)
    assert emitted == [[10, 99], [20, 21], [30]]
    got = _apply(rows, drafts, tokens, slots)
    assert (got[5], got[2], got[6]) == (99, 21, 30)
    assert got[0] == -7  # untouched slots stay


def test_plain_decode_rows_are_copied_as_they_are():
    got = _apply([(0, 0), (1, 0)], [[], []], [41, 42], [1, 3], drafted=False)
    assert (got[1], got[3]) == (41, 42)
