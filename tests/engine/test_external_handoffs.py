"""frontend/external_handoffs.py without servers: a producer's handoff becomes vLLM's prefill
answer (finish 'length', the proxy's fields, a release token), a release needs that token, a
consumer's first token waits for the engine's first output, params used once (or a first token
that ends the request) compute the prompt, and releases go only to this host."""

from __future__ import annotations

from ladle.frontend.external_handoffs import ExternalHandoffs
from ladle.kv_transfer.config import KVTransferConfig
from ladle.protocol.messages import EngineCoreOutput
from ladle.sampling.params import SamplingParams

ENGINE_HANDOFF = {"do_remote_prefill": True, "remote_request_id": "p-1", "remote_kv": "pool",
                  "remote_block_ids": [4, 5], "block_size": 16, "sampling_seed": 3,
                  "expires_at": 1e12}


def handoffs(host: str = "0.0.0.0") -> ExternalHandoffs:
    return ExternalHandoffs(KVTransferConfig(kv_role="kv_both"), host, 8100)


def test_producer_answer_and_token_release():
    producer = handoffs()
    step = [EngineCoreOutput("p-1", [42], finish_reason="remote_decode",
                             kv_transfer_params=ENGINE_HANDOFF),
            EngineCoreOutput("other", [7])]
    outputs, answers = producer.on_outputs(step)
    assert outputs[0].finish_reason == "length" and outputs[0].kv_transfer_params is None
    assert outputs[1] is step[1]
    params = answers["p-1"]
    assert params["first_token_ids"] == [42] and params["do_remote_decode"] is False
    assert (params["remote_host"], params["remote_port"]) == ("127.0.0.1", 8100)
    assert params["remote_engine_id"] == "ladle-127.0.0.1:8100"
    assert producer.releasable(["p-1", "other"], "f" * 32) == []  # wrong token
    assert producer.releasable(["p-1", "other"], params["release_token"]) == ["p-1"]
    assert producer.releasable(["p-1"], params["release_token"]) == []  # once


def test_consumer_holds_the_first_token_back_and_uses_params_once():
    consumer = handoffs()
    params = dict(ENGINE_HANDOFF, first_token_ids=[42], remote_host="127.0.0.1",
                  remote_port=8100, remote_engine_id="p", release_token="t")
    sampling = SamplingParams(max_tokens=8)
    assert consumer.engine_params("d-1", params, sampling, (2,)) is params
    outputs, _ = consumer.on_outputs([EngineCoreOutput("d-1", [9])])
    assert outputs[0].new_token_ids == [42, 9]
    outputs, _ = consumer.on_outputs([EngineCoreOutput("d-1", [10])])
    assert outputs[0].new_token_ids == [10]  # only in front of the first
    # The same params again: the producer may have reused those blocks, so compute.
    assert consumer.engine_params("d-2", params, sampling, (2,)) is None


def test_a_first_token_that_ends_the_request_computes():
    consumer = handoffs()
    base = dict(ENGINE_HANDOFF, remote_engine_id="p", release_token="t")
    one = SamplingParams(max_tokens=1)
    assert consumer.engine_params("a", dict(base, first_token_ids=[5], remote_request_id="a"),
                                  one, (2,)) is None
    eos = dict(base, first_token_ids=[2], remote_request_id="b")
    assert consumer.engine_params("b", eos, SamplingParams(max_tokens=8), (2,)) is None
    ignoring = dict(base, first_token_ids=[2], remote_request_id="c")
    assert consumer.engine_params("c", ignoring, SamplingParams(max_tokens=8, ignore_eos=True),
                                  (2,)) is ignoring


def test_releases_go_only_to_this_host():
    consumer = handoffs("10.1.2.3")
    assert consumer._is_local("127.0.0.1") and consumer._is_local("::1")
    assert consumer._is_local("localhost") and consumer._is_local("10.1.2.3")
    assert not consumer._is_local("10.9.9.9") and not consumer._is_local("example.com")


def test_old_entries_are_dropped(monkeypatch):
    from ladle.frontend import external_handoffs as module

    clock = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    consumer = handoffs()
    sampling = SamplingParams(max_tokens=8)
    for index in range(3):
        params = dict(ENGINE_HANDOFF, first_token_ids=[42], remote_request_id=f"r{index}")
        consumer.engine_params(f"d{index}", params, sampling, (2,))
        clock[0] += 1.0
    assert len(consumer._used) == 3
    clock[0] += module._USED_TTL_S - 2.5  # now 1600.5: r0 (used at 1000) is past the TTL
    consumer.engine_params("d9", dict(ENGINE_HANDOFF, first_token_ids=[42],
                                      remote_request_id="r9"), sampling, (2,))
    assert [key[1] for key in consumer._used] == ["r1", "r2", "r9"]
    producer = handoffs()
    for index, expiry in enumerate((1010.0, 1020.0)):
        producer.on_handoff(f"p{index}", dict(ENGINE_HANDOFF, expires_at=expiry), [1])
    clock[0] = 1015.0
    producer.on_handoff("p2", dict(ENGINE_HANDOFF, expires_at=1075.0), [1])
    assert list(producer._releasable) == ["p1", "p2"]
