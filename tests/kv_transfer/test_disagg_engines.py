"""A producer and a consumer engine give the tokens of one engine (tiny-llama, CPU, greedy and
seeded), the consumer pulls only the blocks its prefix cache lacks, and aborts, expiries and a
vanished producer leak no block on either side."""

from __future__ import annotations

import random

import pytest

from ladle.protocol.messages import EngineCoreRequest, RequestRejectedError
from ladle.sampling.params import SamplingParams
from tests.kv_transfer.disagg_engines import (
    BLOCK_SIZE,
    aggregated_tokens,
    decode_request,
    disaggregated_tokens,
    free_blocks,
    make_engine,
    prefill,
    run_until_done,
    tokens_of,
)

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=8, ignore_eos=True, seed=11,
                        repetition_penalty=1.3)


def prompts(num: int, seed: int = 3) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(rng.randrange(5, 23))] for _ in range(num)]


@pytest.fixture(scope="module")
def engines():
    return make_engine(), make_engine("kv_producer"), make_engine("kv_consumer")


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded-penalty"])
def test_same_tokens_as_one_engine(engines, params):
    single, producer, consumer = engines
    start = free_blocks(producer), free_blocks(consumer)
    batch = prompts(5)
    expected = aggregated_tokens(single, batch, params)
    assert disaggregated_tokens(producer, consumer, batch, params, prefix="p") == expected
    assert (free_blocks(producer), free_blocks(consumer)) == start


def test_consumer_pulls_only_the_blocks_it_lacks(engines):
    single, producer, consumer = engines
    shared = [7 + i for i in range(4 * BLOCK_SIZE)]  # four full blocks
    first = [shared + [300, 301, 302]]
    second = [shared + [400, 401]]
    disaggregated_tokens(producer, consumer, first, GREEDY, prefix="a")
    pulled_before = consumer.scheduler.pulls.num_blocks_pulled
    tokens = disaggregated_tokens(producer, consumer, second, GREEDY, prefix="b")
    # The consumer holds the four shared blocks from the first request: only the last moves.
    assert consumer.scheduler.pulls.num_blocks_pulled - pulled_before == 1
    assert tokens == aggregated_tokens(single, second, GREEDY)


def test_abort_while_pulling_frees_both_sides(engines):
    _, producer, consumer = engines
    start = free_blocks(producer), free_blocks(consumer)
    batch = prompts(2, seed=5)
    handoffs = prefill(producer, batch, GREEDY, prefix="x")
    assert free_blocks(producer) < start[0]  # held for the consumer
    consumer.add_request(decode_request("x0", batch[0], GREEDY, handoffs["x0"]))
    consumer.add_request(decode_request("x1", batch[1], GREEDY, handoffs["x1"]))
    # Scheduled: the pulls are in the next plan, the requests wait for their KV.
    plan = consumer.scheduler.schedule()
    assert len(plan.kv_operations) == 2 and len(consumer.scheduler.waiting_for_kv) == 2
    consumer.executor.submit(plan).result()  # the pulls run; their results are never read
    consumer.abort_requests(["x0", "x1"])
    producer.abort_requests(["x0", "x1"])
    consumer.step()  # the workers forget them
    assert (free_blocks(producer), free_blocks(consumer)) == start
    assert consumer.scheduler.pulls.num_in_flight == 0


def test_unpulled_handoff_expires(engines):
    _, producer, _ = engines
    start = free_blocks(producer)
    prefill(producer, prompts(1, seed=9), GREEDY, prefix="e")
    assert producer.scheduler.handoffs.num_held == 1
    producer.scheduler.handoffs.expire(now=float("inf"))
    assert free_blocks(producer) == start and producer.scheduler.handoffs.num_held == 0


def test_failed_pull_recomputes_on_the_consumer(engines):
    single, producer, consumer = engines
    start = free_blocks(producer), free_blocks(consumer)
    batch = prompts(1, seed=13)
    handoffs = prefill(producer, batch, GREEDY, prefix="f")
    request = decode_request("f0", batch[0], GREEDY, handoffs["f0"])
    # The producer's pool is gone (it died): the pull fails, the consumer computes the prompt.
    request.kv_transfer_params["remote_kv"] = (
        '{"kind": "shm", "path": "/dev/shm/ladle-kv-gone", "shape": [1], "dtype": "float32"}'
    )
    consumer.add_request(request)
    outputs = run_until_done(consumer, {"f0"})
    producer.abort_requests(["f0"])
    expected = aggregated_tokens(single, batch, GREEDY)[0]
    assert list(handoffs["f0"].new_token_ids) + tokens_of(outputs["f0"]) == expected
    assert consumer.scheduler.pulls.num_failed >= 1
    assert (free_blocks(producer), free_blocks(consumer)) == start


def test_bad_handoffs_are_refused_by_field(engines):
    single, producer, consumer = engines
    params = {"do_remote_prefill": True, "remote_kv": "x", "block_size": BLOCK_SIZE,
              "remote_block_ids": [1], "first_token_ids": [5]}
    with pytest.raises(RequestRejectedError, match="remote_block_ids"):
        consumer.add_request(EngineCoreRequest("b0", list(range(3, 12)), GREEDY,
                                               kv_transfer_params=params))
    with pytest.raises(RequestRejectedError, match="not a producer"):
        consumer.add_request(EngineCoreRequest("b1", [3, 4], GREEDY,
                                               kv_transfer_params={"do_remote_decode": True}))
    with pytest.raises(RequestRejectedError, match="not disaggregated"):
        single.add_request(EngineCoreRequest("b2", [3, 4], GREEDY,
                                             kv_transfer_params={"do_remote_decode": True}))
    assert not consumer.has_unfinished_requests()


def test_overlapped_steps_on_both_engines():
    """With overlapped scheduling (the CUDA default) a producer's next step is already running
    when the first token is read: the handoff still holds the right blocks (perhaps one more),
    and the consumer's first step of a pulled request is planned while another is in flight."""
    single = make_engine()
    producer = make_engine("kv_producer", async_scheduling=True)
    consumer = make_engine("kv_consumer", async_scheduling=True)
    start = free_blocks(producer), free_blocks(consumer)
    batch = prompts(6, seed=21)
    expected = aggregated_tokens(single, batch, GREEDY)
    assert disaggregated_tokens(producer, consumer, batch, GREEDY, prefix="o") == expected
    consumer.step()
    producer.step()
    assert (free_blocks(producer), free_blocks(consumer)) == start


def test_a_handoff_about_to_expire_is_computed_not_pulled(engines):
    single, producer, consumer = engines
    start = free_blocks(producer), free_blocks(consumer)
    batch = prompts(1, seed=31)
    handoffs = prefill(producer, batch, GREEDY, prefix="late")
    request = decode_request("late0", batch[0], GREEDY, handoffs["late0"])
    request.kv_transfer_params["expires_at"] = 0.0  # the producer frees it any moment now
    pulled_before = consumer.scheduler.pulls.num_blocks_pulled
    consumer.add_request(request)
    outputs = run_until_done(consumer, {"late0"})
    producer.abort_requests(["late0"])
    assert consumer.scheduler.pulls.num_blocks_pulled == pulled_before
    expected = aggregated_tokens(single, batch, GREEDY)[0]
    assert list(handoffs["late0"].new_token_ids) + tokens_of(outputs["late0"]) == expected
    assert (free_blocks(producer), free_blocks(consumer)) == start
