"""`ladle bench multiturn`: seeded conversations, the working-set sizing, and a run through a
tiny engine whose device pool is a third of the working set (hits come from the host tier)."""

from __future__ import annotations

import pytest

from ladle import LLM
from ladle.bench.multiturn import (
    MultiturnWorkload,
    build_conversations,
    conversations_for_working_set,
    run_multiturn,
)

WORKLOAD = MultiturnWorkload(num_turns=3, first_turn_len=(12, 20), turn_len=(8, 16),
                             reply_len=(2, 4), max_token_id=500, concurrency=2)


def test_conversations_are_seeded_and_a_prefix_of_longer_lists():
    few, more = build_conversations(WORKLOAD, 3), build_conversations(WORKLOAD, 5)
    assert [c.turns for c in few] == [c.turns for c in more[:3]]
    other = build_conversations(MultiturnWorkload(**{**WORKLOAD.__dict__, "seed": 1}), 3)
    assert [c.turns for c in other] != [c.turns for c in few]
    for conversation in few:
        assert len(conversation.turns) == 3 and 12 <= len(conversation.turns[0]) <= 20
        assert all(8 <= len(t) <= 16 for t in conversation.turns[1:])
        assert conversation.num_working_set_tokens == (
            sum(map(len, conversation.turns)) + sum(conversation.reply_lens)
        )


def test_working_set_reaches_the_multiple_with_the_fewest_conversations():
    conversations = conversations_for_working_set(WORKLOAD, pool_tokens=400, multiple=3.0)
    sizes = [c.num_working_set_tokens for c in conversations]
    assert sum(sizes) >= 1200 > sum(sizes[:-1])
    assert [c.turns for c in conversations] == [
        c.turns for c in build_conversations(WORKLOAD, len(conversations))
    ]
    with pytest.raises(ValueError, match="multiple"):
        conversations_for_working_set(WORKLOAD, pool_tokens=400, multiple=0)
    with pytest.raises(ValueError, match="turn_len"):
        MultiturnWorkload(turn_len=(5, 2))
    with pytest.raises(ValueError, match="concurrency"):
        MultiturnWorkload(concurrency=0)


@pytest.mark.parametrize("host_gib", [0, 0.001])
def test_histories_return_and_the_host_tier_serves_them(host_gib):
    llm = LLM("tiny-llama", load_format="dummy", block_size=4, num_kv_blocks=21,
              max_model_len=80, kv_offloading_size=host_gib)
    conversations = conversations_for_working_set(WORKLOAD, 80, 3.0)
    result = run_multiturn(llm.engine, conversations, WORKLOAD)
    assert result["num_requests"] == 3 * len(conversations)
    # The closed loop keeps exactly `concurrency` users busy, never more.
    assert result["max_in_flight"] == WORKLOAD.concurrency
    expected_generated = sum(sum(c.reply_lens) for c in conversations)
    assert result["generated_tokens"] == expected_generated
    # Each final history is every turn plus the model's replies.
    for conversation in conversations:
        assert len(conversation.history) == conversation.num_working_set_tokens
    if host_gib:
        assert result["host_hit_rate"] > 0.2 and result["bytes_to_device"] > 0
    else:
        assert result["host_hit_rate"] == 0 and result["bytes_to_device"] == 0
    assert result["cached_rate"] + result["computed_rate"] == pytest.approx(1.0)
    # Each later turn's history was evicted from the 80-token pool by the other conversations'
    # turns in between: without the tier every prompt token is computed again.
    assert result["device_hit_rate"] >= 0
    assert (0 < result["computed_rate"] < 0.8) if host_gib else result["computed_rate"] > 0.9
