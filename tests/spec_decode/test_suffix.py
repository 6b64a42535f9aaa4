"""Suffix drafting: the request's own text, earlier requests' outputs through the global table
(counts, the most frequent continuation, the share threshold, eviction)."""

from __future__ import annotations

from ladle.spec_decode.suffix import GlobalSuffixTable, SuffixProposer


def test_drafts_from_an_earlier_requests_output():
    proposer = SuffixProposer(min_n=2, max_n=4, max_cached_requests=8)
    answer = [50, 51, 52, 53, 54, 55, 56, 57]
    # Nothing known yet: no draft.
    assert proposer.propose_from("a", [1, 2, 50, 51], 4) == []
    proposer.release("a", answer)
    # A new request whose prompt never held the answer starts the same answer.
    assert proposer.propose_from("b", [9, 9, 50, 51, 52], 4) == [53, 54, 55, 56]


def test_the_requests_own_text_wins_a_longer_match():
    proposer = SuffixProposer(min_n=2, max_n=4, max_cached_requests=8)
    proposer.release("old", [10, 11, 99, 98])
    own = [7, 10, 11, 12, 13, 14, 7, 10, 11]
    # Own text matches 3 tokens (7 10 11); the table only 2 (10 11): the request's own wins.
    assert proposer.propose_from("new", own, 3) == [12, 13, 14]


def test_the_most_frequent_continuation_and_the_share_threshold():
    table = GlobalSuffixTable(min_n=2, max_n=3, max_cached_requests=10)
    for _ in range(3):
        table.add([1, 2, 3, 4])
    table.add([1, 2, 9, 9])
    draft, match = table.walk([0, 1, 2], 3, min_token_share=0.3)
    assert draft == [3, 4] and match == 2  # 3 follows (1, 2) three times in four
    # A continuation with too small a share is not drafted.
    assert table.walk([0, 1, 2], 3, min_token_share=0.8)[0] == []


def test_eviction_removes_exactly_the_evicted_requests_counts():
    table = GlobalSuffixTable(min_n=2, max_n=3, max_cached_requests=2)
    table.add([1, 2, 3])
    table.add([5, 6, 7])
    fresh = GlobalSuffixTable(min_n=2, max_n=3, max_cached_requests=2)
    table.add([8, 9, 10])  # evicts [1, 2, 3]
    fresh.add([5, 6, 7])
    fresh.add([8, 9, 10])
    assert table.next_counts == fresh.next_counts
    assert table.walk([1, 2], 2, 0.0)[0] == []
