"""The swap-or-recompute rule (core/preemption_cost.py), computed by hand."""

from __future__ import annotations

import pytest

from ladle.core.preemption_cost import PreemptionPolicy, prefers_swap

BLOCK = 16
BLOCK_BYTES = 1_000_000  # 1 MB a block: easy arithmetic


def test_long_victim_swaps_when_copying_beats_prefill():
    # 64 blocks on the host: copy back 64 MB at 10 GB/s = 6.4 ms + 0.4 ms latency;
    # recompute 1024 tokens at 20k tok/s = 51.2 ms.
    assert prefers_swap(1024, 64, BLOCK, BLOCK_BYTES, 10e9, 20_000)


def test_slow_link_or_fast_prefill_recomputes():
    # 64 MB back at 1 GB/s = 64 ms > 1024 tokens at 20k tok/s = 51.2 ms.
    assert not prefers_swap(1024, 64, BLOCK, BLOCK_BYTES, 1e9, 20_000)
    # At 200k tok/s the recompute takes 5.1 ms < 6.8 ms of copies.
    assert not prefers_swap(1024, 64, BLOCK, BLOCK_BYTES, 10e9, 200_000)


def test_blocks_not_yet_on_host_cost_a_copy_out_too():
    # Back only: 6.4 ms + 0.4 < 7.5 ms of recompute (1024 tokens at 136.5k tok/s).
    rate = 1024 / 7.5e-3
    assert prefers_swap(1024, 64, BLOCK, BLOCK_BYTES, 10e9, rate)
    # Out and back: 12.8 ms + 0.4 > 7.5 ms.
    assert not prefers_swap(1024, 0, BLOCK, BLOCK_BYTES, 10e9, rate)


def test_tail_is_recomputed_either_way_and_less_than_a_block_never_swaps():
    assert not prefers_swap(BLOCK - 1, 0, BLOCK, BLOCK_BYTES, 1e12, 1.0)
    # 1 block + 8 tail tokens: the tail costs the same on both sides, the block decides.
    assert prefers_swap(BLOCK + 8, 1, BLOCK, BLOCK_BYTES, 1e12, 1000.0)


def test_bad_rates_are_refused():
    with pytest.raises(ValueError, match="copy_bytes_per_s"):
        prefers_swap(64, 0, BLOCK, BLOCK_BYTES, 0.0, 1000.0)
    with pytest.raises(ValueError, match=">= 0"):
        prefers_swap(-1, 0, BLOCK, BLOCK_BYTES, 1e9, 1000.0)


def test_policy_modes():
    with pytest.raises(ValueError, match="preemption_mode"):
        PreemptionPolicy(mode="sometimes")
    assert PreemptionPolicy(mode="swap").swaps(1, 0)
    assert not PreemptionPolicy(mode="recompute").swaps(10**6, 10**5)
    auto = PreemptionPolicy(mode="auto", block_size=BLOCK, block_bytes=BLOCK_BYTES)
    assert not auto.swaps(1024, 64)  # no measured rates yet: today's behaviour
    auto.copy_bytes_per_s, auto.prefill_tokens_per_s = 10e9, 20_000
    assert auto.swaps(1024, 64)
