"""The typed messages between the API process and the engine-core process, and their encoding.

Both directions are msgpack through msgspec, decoded against a tagged union of Structs, so a
malformed frame is a DecodeError and never runs code (pickle would). The payloads reuse the
engine's own types (EngineCoreRequest, SchedulerStats: dataclasses, encoded field by field;
EngineCoreOutput, TokenLogprobs: Structs encoded as arrays); SamplingParams is validated again
by its __post_init__ on decoding.

API -> engine:   AddRequests | AbortRequests | Shutdown
engine -> API:   EngineReady (once) | EngineStep (outputs, rejections, stats) | EngineFailed
"""

from __future__ import annotations

import msgspec

from ladle.model.arch_config import ModelArchConfig
from ladle.protocol.messages import EngineCoreOutput, EngineCoreRequest, SchedulerStats

# ----- API process -> engine core ------------------------------------------------------------


class AddRequests(msgspec.Struct, tag="add"):
    """Queue these sequences (the n children of one API request travel together)."""

    requests: list[EngineCoreRequest]


class AbortRequests(msgspec.Struct, tag="abort"):
    """End these sequences at the next step and free their KV blocks."""

    request_ids: list[str]


class Shutdown(msgspec.Struct, tag="shutdown"):
    """Leave the loop and exit cleanly."""


EngineInput = AddRequests | AbortRequests | Shutdown

# ----- engine core -> API process ------------------------------------------------------------


class EngineReady(msgspec.Struct, tag="ready"):
    """Sent once the model is loaded and the KV pool allocated; the API then loads the tokenizer
    from tokenizer_source and starts answering."""

    max_model_len: int  # capped to the tokens the KV pool holds: no request may need more
    tokenizer_source: str | None  # a folder or .gguf file; None for dummy weights
    arch: ModelArchConfig
    memory_budget: str  # the human-readable budget the engine printed
    # Request defaults from the model's generation config (model/generation_defaults.py).
    sampling_defaults: dict[str, float | int] = msgspec.field(default_factory=dict)
    # The ids that end generation by the model's own files (config and generation config),
    # for an API process that runs without a tokenizer (model/end_tokens.py).
    end_token_ids: list[int] = msgspec.field(default_factory=list)


class Rejection(msgspec.Struct):
    """A sequence the engine refused at admission (RequestRejectedError), with the reason."""

    request_id: str
    message: str


class EngineStep(msgspec.Struct, tag="step"):
    """What one loop iteration produced. Also sent idle, as a heartbeat carrying fresh stats."""

    outputs: list[EngineCoreOutput] = []
    rejections: list[Rejection] = []
    stats: SchedulerStats | None = None


class EngineFailed(msgspec.Struct, tag="failed"):
    """The engine hit an error it cannot recover from (at start-up or in a step) and exits."""

    message: str


EngineOutput = EngineReady | EngineStep | EngineFailed

# ----- codecs ----------------------------------------------------------------------------------

_input_encoder = msgspec.msgpack.Encoder()
_input_decoder = msgspec.msgpack.Decoder(EngineInput)
_output_encoder = msgspec.msgpack.Encoder()
_output_decoder = msgspec.msgpack.Decoder(EngineOutput)


def encode_input(message: EngineInput) -> bytes:
    return _input_encoder.encode(message)


def decode_input(frame: bytes) -> EngineInput:
    """Raises msgspec.DecodeError / ValidationError on a malformed frame."""
    return _input_decoder.decode(frame)


def encode_output(message: EngineOutput) -> bytes:
    return _output_encoder.encode(message)


def decode_output(frame: bytes) -> EngineOutput:
    """Raises msgspec.DecodeError / ValidationError on a malformed frame."""
    return _output_decoder.decode(frame)
