"""A stand-in engine core of known speed, for measuring everything around the GPU.

Every `step_s` it gives each running request one token (one `EngineCoreOutput` per request,
all in one `EngineStep` frame, as the real engine sends them) until the request's max_tokens,
through the real EngineCoreLoop and ZMQ wire. Its step time is therefore exact, and what a
client sees beyond it (late or bunched tokens) is the API process's or the client's doing.

The tokens are ids of real text when a tokenizer is named (so the detokenizer meets real
words), else ids spread over the vocabulary; a request that asked for logprobs gets one
TokenLogprobs per token, as the real sampler returns them.

Used by `ladle.bench.paced_serve` (the real `ladle serve` with this engine) and
`scripts/served_path_bench.py`.
"""

from __future__ import annotations

import os
import random
import time

import zmq

from ladle.engine.core_process import EngineCoreLoop
from ladle.engine.gc_policy import freeze_startup_objects
from ladle.model.default_model import resolve_default_model
from ladle.model.tokenizer import load_tokenizer
from ladle.protocol import wire
from ladle.protocol.messages import (
    EngineCoreOutput,
    EngineCoreRequest,
    SchedulerStats,
    TokenLogprobs,
)

STEP_MS_ENV = "LADLE_PACED_STEP_MS"
TOKENIZER_ENV = "LADLE_PACED_TOKENIZER"  # a tokenizer source, or "none"
VOCAB_SIZE_ENV = "LADLE_PACED_VOCAB_SIZE"
DEFAULT_VOCAB_SIZE = 151_936  # the Qwen3-0.6B shape of S1


class _Running:
    __slots__ = ("request_id", "num_generated", "max_tokens", "logprobs", "offset")

    def __init__(self, request: EngineCoreRequest, offset: int) -> None:
        self.request_id = request.request_id
        self.num_generated = 0
        self.max_tokens = request.sampling_params.max_tokens or 16
        self.logprobs = request.sampling_params.logprobs is not None
        self.offset = offset


class PacedEngine:
    """EngineCore's interface as EngineCoreLoop uses it: one token per request per step."""

    def __init__(self, step_s: float, token_ids: list[int]) -> None:
        self.step_s = step_s
        self.token_ids = token_ids
        self.running: dict[str, _Running] = {}
        self.next_step = time.perf_counter()
        self.stats = SchedulerStats()
        self._offsets = random.Random(0)

    def has_unfinished_requests(self) -> bool:
        return bool(self.running)

    def add_request(self, request: EngineCoreRequest) -> None:
        offset = self._offsets.randrange(len(self.token_ids))
        self.running[request.request_id] = _Running(request, offset)

    def abort_requests(self, request_ids: list[str]) -> list[EngineCoreOutput]:
        outputs = []
        for request_id in request_ids:
            if self.running.pop(request_id, None) is not None:
                outputs.append(EngineCoreOutput(request_id, [], finish_reason="abort"))
        return outputs

    def step(self) -> list[EngineCoreOutput]:
        now = time.perf_counter()
        if self.next_step > now:
            time.sleep(self.next_step - now)
        # A step that starts late (the loop was busy) does not make the next one early.
        self.next_step = max(self.next_step + self.step_s, time.perf_counter())
        outputs = []
        token_ids = self.token_ids
        for state in list(self.running.values()):
            token = token_ids[(state.offset + state.num_generated) % len(token_ids)]
            state.num_generated += 1
            finished = state.num_generated >= state.max_tokens
            outputs.append(
                EngineCoreOutput(
                    state.request_id,
                    [token],
                    new_logprobs=[TokenLogprobs(token, -1.25, 1)] if state.logprobs else None,
                    finish_reason="length" if finished else None,
                    first_token_time=time.monotonic() if state.num_generated == 1 else None,
                )
            )
            if finished:
                del self.running[state.request_id]
        return outputs

    def get_stats(self) -> SchedulerStats:
        self.stats.num_running_reqs = len(self.running)
        return self.stats


def paced_token_ids(tokenizer_source: str | None, vocab_size: int) -> list[int]:
    """Ids of real English-like text under the tokenizer, or ids spread over the vocabulary."""
    if tokenizer_source is None:
        rng = random.Random(0)
        return [rng.randrange(vocab_size) for _ in range(65_536)]
    tokenizer = load_tokenizer(tokenizer_source).hf_tokenizer
    with open(__file__, encoding="utf-8") as handle:
        text = handle.read()
    return tokenizer.encode(text * 8, add_special_tokens=False)


def _tokenizer_source() -> str | None:
    named = os.environ.get(TOKENIZER_ENV)
    if named == "none":
        return None
    if named:
        return named
    return str(resolve_default_model(show_progress=False))


def paced_engine_core(
    engine_options_json: str, input_address: str, output_address: str, parent_pid: int
) -> None:
    """The engine-core process entry, with run_engine_core's signature (the spawn target)."""
    # The loader imports torch (~1 s): only this engine-core process needs it, not the API
    # process that imports this module to name the spawn target (paced_serve.py).
    from ladle.model.loader import _dummy_arch_config

    context = zmq.Context()
    input_socket = context.socket(zmq.PULL)
    input_socket.connect(input_address)
    output_socket = context.socket(zmq.PUSH)
    output_socket.connect(output_address)
    source = _tokenizer_source()
    vocab_size = int(os.environ.get(VOCAB_SIZE_ENV, DEFAULT_VOCAB_SIZE))
    engine = PacedEngine(
        float(os.environ.get(STEP_MS_ENV, "7")) / 1000, paced_token_ids(source, vocab_size)
    )
    arch, _ = _dummy_arch_config("qwen3-0.6b", {})
    ready = wire.EngineReady(
        max_model_len=8192, tokenizer_source=source, arch=arch, memory_budget="paced stand-in"
    )
    freeze_startup_objects()
    output_socket.send(wire.encode_output(ready))
    EngineCoreLoop(engine, input_socket, output_socket, parent_pid).run()
    os._exit(0)
