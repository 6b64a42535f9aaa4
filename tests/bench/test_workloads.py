"""The standard workloads match their published definition (the GPU-speed issue's recipe)."""

import random

import pytest

from ladle.bench.workloads import W1, W3_SMALL, build_requests, get_workload


def test_w1_matches_the_recipe_and_its_published_token_count():
    requests = build_requests(W1)
    # The recipe written out by hand, draw for draw.
    rng = random.Random(0)
    for request in requests:
        prompt = [rng.randint(0, 10000) for _ in range(rng.randint(100, 1024))]
        assert request.prompt_token_ids == prompt
        assert request.max_tokens == rng.randint(100, 1024)
    assert len(requests) == 256
    assert sum(r.max_tokens for r in requests) == 140_084  # the figure the issue states


def test_a_prefix_of_a_workload_is_its_first_requests():
    assert build_requests(W1, num_requests=8) == build_requests(W1)[:8]


def test_latency_workload_is_one_fixed_greedy_request():
    (request,) = build_requests(W3_SMALL)
    assert len(request.prompt_token_ids) == 512
    assert request.max_tokens == 256 and request.temperature == 0.0


def test_unknown_workload_names_the_choices():
    with pytest.raises(ValueError, match="W1"):
        get_workload("W9")
