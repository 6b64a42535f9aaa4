"""The engine <-> API messages survive msgpack, and bad frames fail to decode (never execute)."""

from __future__ import annotations

import msgspec
import pytest

from ladle.protocol import wire
from ladle.protocol.messages import (
    EngineCoreOutput,
    EngineCoreRequest,
    SchedulerStats,
    TokenLogprobs,
)
from ladle.sampling.params import SamplingParams


def test_add_request_round_trip():
    params = SamplingParams(n=1, temperature=0.5, stop="END", seed=7, max_tokens=None, logprobs=2)
    request = EngineCoreRequest("r-1", [1, 2, 3], params, (3, 4), 12.5, priority=2)
    decoded = wire.decode_input(wire.encode_input(wire.AddRequests([request])))
    assert decoded == wire.AddRequests([request])
    assert decoded.requests[0].sampling_params.stop == ["END"]
    assert decoded.requests[0].eos_token_ids == (3, 4)


def test_step_round_trip():
    output = EngineCoreOutput(
        "r-1", [9], [TokenLogprobs(9, -0.5, 1, [9, 8], [-0.5, -1.5])], "stop", 3, 16, 1.0, 2.0
    )
    stats = SchedulerStats(num_running_reqs=3, kv_cache_usage=0.25, prefix_cache_hits=5)
    step = wire.EngineStep([output], [wire.Rejection("r-2", "too long")], stats)
    assert wire.decode_output(wire.encode_output(step)) == step


def test_abort_and_shutdown_round_trip():
    for message in (wire.AbortRequests(["a", "b"]), wire.Shutdown()):
        assert wire.decode_input(wire.encode_input(message)) == message


def test_garbage_and_wrong_tags_fail_to_decode():
    with pytest.raises(msgspec.DecodeError):
        wire.decode_input(b"\xc1\xff not msgpack")
    with pytest.raises(msgspec.ValidationError):
        wire.decode_input(msgspec.msgpack.encode({"type": "exec", "code": "boom"}))
    with pytest.raises(msgspec.ValidationError):  # an output message is not an input
        wire.decode_input(wire.encode_output(wire.EngineFailed("x")))


def test_sampling_params_are_validated_on_decoding():
    frame = msgspec.msgpack.encode(
        {"type": "add", "requests": [{"request_id": "a", "prompt_token_ids": [1],
                                      "sampling_params": {"top_p": 2.0}}]}
    )
    with pytest.raises(msgspec.ValidationError, match="top_p"):
        wire.decode_input(frame)


def test_a_step_frame_is_compact_and_decodes_to_untracked_outputs():
    """The per-stream objects of a step frame are arrays on the wire (no field names: S1's
    256-stream frame was 263 bytes an output as maps) and the decoded EngineCoreOutput and
    TokenLogprobs are not tracked by the garbage collector, which would scan each frame."""
    import gc

    outputs = [
        EngineCoreOutput(f"cmpl-{i:032x}-0", [i], new_logprobs=[TokenLogprobs(i, -1.5, 1)])
        for i in range(256)
    ]
    frame = wire.encode_output(wire.EngineStep(outputs=outputs))
    assert len(frame) < 256 * 80  # request id (~40 bytes), one token, one logprob
    decoded = wire.decode_output(frame)
    assert decoded.outputs == outputs
    first = decoded.outputs[0]
    assert first.first_token_time is None and first.finish_reason is None
    assert not gc.is_tracked(first) and not gc.is_tracked(first.new_logprobs[0])
