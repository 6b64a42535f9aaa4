"""The prefix-aware policy, without Ray: keys agree with the engine's block hashes, a prefix sticks
to its replica within the load margin, spills past it, distinct prefixes spread out, and separate
policies (one per front process) agree on a new prefix's owner."""

import pytest

from ladle.core.block_hash import hash_block_tokens
from ladle.entrypoints.cluster.prefix_routing import (
    REASON_NEW_PREFIX,
    REASON_NO_PREFIX,
    REASON_OVERLOADED,
    REASON_PREFIX_HIT,
    PrefixAwarePolicy,
    prefix_routing_key,
    rendezvous_weight,
)


def test_key_is_the_engine_block_hash_of_the_first_blocks():
    tokens = list(range(100, 150))  # 3 full blocks of 16, then 2 tokens
    first = hash_block_tokens(None, tuple(tokens[:16]))
    second = hash_block_tokens(first, tuple(tokens[16:32]))
    assert prefix_routing_key(tokens, block_size=16, num_prefix_blocks=2) == second
    third = hash_block_tokens(second, tuple(tokens[32:48]))
    # Asking for more blocks than the prompt has: the last full one.
    assert prefix_routing_key(tokens, block_size=16, num_prefix_blocks=8) == third
    assert prefix_routing_key(tokens[:15], block_size=16) is None
    # Only the first blocks count: a different tail keeps the key, a different head changes it.
    assert prefix_routing_key(tokens[:32] + [7] * 40, 16, 2) == second
    assert prefix_routing_key([1] + tokens[1:], 16, 2) != second


def test_key_rejects_bad_sizes():
    with pytest.raises(ValueError, match="block_size"):
        prefix_routing_key([1, 2, 3], block_size=0)


def _key_owned_first_by(replica: str, replicas: tuple[str, ...]) -> int:
    """A key whose rendezvous winner among `replicas` is `replica`."""
    return next(
        key
        for key in range(1000)
        if max(replicas, key=lambda r: rendezvous_weight(key, r)) == replica
    )


def test_same_prefix_sticks_to_its_owner_within_the_margin():
    policy = PrefixAwarePolicy(load_margin=2)
    key = _key_owned_first_by("a", ("a", "b"))
    first = policy.choose(key, {"a": 0, "b": 0})
    assert (first.replica, first.reason) == ("a", REASON_NEW_PREFIX)
    # The owner is busier, but by no more than the margin: the prefix stays.
    assert policy.choose(key, {"a": 2, "b": 0}).replica == "a"
    assert policy.choose(key, {"a": 2, "b": 0}).reason == REASON_PREFIX_HIT
    # Past the margin: the least loaded takes it, and the owner stays the owner.
    spilled = policy.choose(key, {"a": 3, "b": 0})
    assert (spilled.replica, spilled.reason) == ("b", REASON_OVERLOADED)
    assert policy.owner_of(key) == "a"
    assert policy.choose(key, {"a": 1, "b": 0}).replica == "a"


def test_distinct_prefixes_spread_over_idle_replicas():
    policy = PrefixAwarePolicy()
    idle = {"r0": 0, "r1": 0, "r2": 0}
    keys = range(300)
    owners = [policy.choose(key, idle).replica for key in keys]
    assert all(70 <= owners.count(replica) <= 130 for replica in idle), owners
    # System prompts with many requests each: every repeat lands on its owner (no halving of the
    # cache hit rate as round-robin would do).
    for key, owner in zip(keys, owners):
        assert policy.choose(key, idle) == policy.choose(key, idle)
        assert policy.choose(key, idle).replica == owner


def test_front_processes_agree_on_new_owners_without_talking():
    """Each front process has its own policy and its own view of the loads: a new prefix gets
    the same owner from all of them while their loads differ by no more than the margin (a
    conversation's turns arrive through any of them)."""
    first, second = PrefixAwarePolicy(load_margin=4), PrefixAwarePolicy(load_margin=4)
    for key in range(200):
        a = first.choose(key, {"r0": key % 3, "r1": 2, "r2": 0})
        b = second.choose(key, {"r0": 1, "r1": 0, "r2": (key * 7) % 5})
        assert a.replica == b.replica, key
    # A replica past the margin is no candidate for a new prefix.
    crowded = {"r0": 9, "r1": 0, "r2": 0}
    assert all(first.choose(key, crowded).replica != "r0" for key in range(1000, 1100))


def test_no_key_goes_to_the_least_loaded():
    decision = PrefixAwarePolicy().choose(None, {"a": 5, "b": 1, "c": 3})
    assert (decision.replica, decision.reason) == ("b", REASON_NO_PREFIX)


def test_a_gone_owner_hands_its_prefixes_on():
    policy = PrefixAwarePolicy()
    key = _key_owned_first_by("a", ("a", "b"))
    assert policy.choose(key, {"a": 0, "b": 1}).replica == "a"
    # "a" is not among the candidates (dead or scaled away): a new owner is chosen.
    moved = policy.choose(key, {"b": 1, "c": 0})
    assert moved.reason == REASON_NEW_PREFIX and moved.replica in ("b", "c")
    policy.forget_replica(moved.replica)
    assert policy.owner_of(key) is None


def test_owner_table_is_bounded_lru():
    policy = PrefixAwarePolicy(max_tracked_prefixes=2)
    loads = {"a": 0, "b": 0}
    policy.choose(1, loads)
    policy.choose(2, loads)
    policy.choose(1, loads)  # touches 1: 2 is now the least recently used
    policy.choose(3, loads)
    assert policy.owner_of(2) is None
    assert policy.owner_of(1) is not None and policy.owner_of(3) is not None


def test_policy_validates_its_settings_and_input():
    with pytest.raises(ValueError, match="load_margin"):
        PrefixAwarePolicy(load_margin=-1)
    with pytest.raises(ValueError, match="no replica"):
        PrefixAwarePolicy().choose(1, {})


def test_round_robin_takes_turns_whatever_the_prefix_or_load():
    from ladle.entrypoints.cluster.round_robin import REASON_ROUND_ROBIN, RoundRobinPolicy

    policy = RoundRobinPolicy()
    picks = [policy.choose(7, {"b": 9, "a": 0}) for _ in range(4)]
    assert [p.replica for p in picks] == ["a", "b", "a", "b"]
    assert {p.reason for p in picks} == {REASON_ROUND_ROBIN}
    with pytest.raises(ValueError, match="no replica"):
        policy.choose(None, {})


def test_prompt_token_ids_of_completion_bodies():
    """A token-id prompt is one prompt, not a batch of ints (it once got no key at all, so
    token-id requests were routed by load only); a batch routes by its first prompt."""
    import json

    from ladle.entrypoints.cluster.routing_keys import prompt_token_ids

    def ids(prompt):
        return prompt_token_ids("/v1/completions", json.dumps({"prompt": prompt}).encode(), None)

    assert ids([5, 6, 7]) == [5, 6, 7]
    assert ids([[5, 6], [8]]) == [5, 6]
    assert ids("text") is None  # no tokenizer here
    assert prompt_token_ids("/v1/completions", b"not json", None) is None
