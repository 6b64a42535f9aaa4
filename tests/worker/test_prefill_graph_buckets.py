"""Which captured prefill graph a step with prompt tokens replays (worker/prefill_graphs.py):
the smallest bucket that holds the step's tokens plus one token per padding request, with at
least one padding request (it takes the tokens the bucket adds)."""

from __future__ import annotations

import pytest

from ladle.worker.prefill_graphs import largest_prefill_bucket, prefill_bucket

TOKENS = (16, 32, 64, 128, 512, 640)
REQUESTS = (2, 4, 8)


@pytest.mark.parametrize(
    ("num_tokens", "num_reqs", "expected"),
    [
        (1, 1, (16, 2)),  # one request: one padding request, 15 padding tokens
        (15, 1, (16, 2)),
        (16, 1, (32, 2)),  # no room left for the padding request's token in 16
        (512, 1, (640, 2)),
        (100, 2, (128, 4)),  # two real requests: padded to four, two padding requests
        (126, 2, (128, 4)),
        (127, 2, (512, 4)),  # 129 tokens: the next bucket here is 512
        (30, 7, (32, 8)),  # one padding request of one token
        (639, 1, (640, 2)),
        (640, 1, None),  # 640 + 1 fits no bucket: eager
        (10, 8, None),  # no request bucket above 8: eager
    ],
)
def test_prefill_bucket(num_tokens, num_reqs, expected):
    assert prefill_bucket(num_tokens, num_reqs, TOKENS, REQUESTS) == expected


def test_largest_prefill_bucket_follows_the_step_budget():
    assert largest_prefill_bucket(8192) == (2048, 8)
    assert largest_prefill_bucket(1000) == (896, 8)
    assert largest_prefill_bucket(8) is None
