"""Warm-up: run made-up requests through the real engine step before serving anyone.

Triton compiles a kernel variant the first time a launch needs it (the prefill attention tile
follows the longest query of a step, rounded to a power of two; a mixed step adds the decode
launch beside it; each sampling feature has its own kernels). Compiling while serving costs the
first users seconds, so start-up drives schedule -> execute -> update over those shapes:
requests arrive one step apart with prompts of 2, 3, 5, 9, ... tokens (so every step mixes a
new prompt with the decodes of the earlier ones), then one prompt of a full token budget, and
they cycle through the sampling features; last, a full batch (max_num_seqs requests) prefills
and decodes together, the widest sampler batch and, in eager mode, the unsplit decode attention.
Decode-only steps replay the CUDA graphs captured at start-up (their capture built the decode
variants of every bucket). With speculative decoding on, requests with a repeating prompt (so
the n-gram and suffix proposers find drafts) decode long enough to draft, alone and as a batch,
through every sampling feature: the draft kernels, the verify steps and the rejection
samplers are built here, not in a first user's step; the speculator then forgets them (its
load measurements, acceptance estimates, metrics and suffix table).

The kernels keep per-step values (batch sizes, offsets of metadata slices, split factors) out of
Triton's specialisation keys, so the variants are few and these steps build them all: a later
step builds none (tests/gpu/test_no_compile_while_serving.py counts Triton builds to prove it).
Compiled kernels are cached on disk between runs (Triton's cache: TRITON_CACHE_DIR, by default
~/.triton/cache), so a second start-up loads them instead of compiling.
"""

from __future__ import annotations

import dataclasses
import random
from typing import TYPE_CHECKING, Protocol

from ladle.kernels.compile_log import compile_totals
from ladle.protocol.messages import EngineCoreRequest
from ladle.sampling.params import MAX_LOGPROBS, SamplingParams

if TYPE_CHECKING:
    from ladle.config import EngineConfig
    from ladle.core.kv_cache_manager import KVCacheManager
    from ladle.executor.base import Executor
    from ladle.protocol.messages import EngineCoreOutput
    from ladle.spec_decode.speculator import Speculator


class WarmableEngine(Protocol):
    """What the warm-up drives: the engine core's request and step calls (EngineCore)."""

    config: EngineConfig
    max_model_len: int
    vocab_size: int
    kv_cache_manager: KVCacheManager
    executor: Executor

    def add_request(self, core_request: EngineCoreRequest) -> None: ...

    def step(self) -> list[EngineCoreOutput]: ...

    def has_unfinished_requests(self) -> bool: ...

    speculator: Speculator | None


# Every one brings its own seed: the engine's seed stream (for requests without one) must be
# where it would be without a warm-up.
WARMUP_PARAMS = (
    SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, seed=0),
    SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=3, ignore_eos=True, seed=1),
    SamplingParams(temperature=0.7, min_p=0.1, max_tokens=3, ignore_eos=True, seed=2),
    SamplingParams(
        temperature=0.0,
        repetition_penalty=1.1,
        frequency_penalty=0.2,
        presence_penalty=0.2,
        logprobs=MAX_LOGPROBS,
        max_tokens=3,
        ignore_eos=True,
        seed=4,
    ),
    SamplingParams(temperature=0.7, max_tokens=3, min_tokens=2, ignore_eos=False, seed=3),
    # Temperature alone: the only rows whose draw reads the LM head's 16-bit logits as they are
    # (every feature above makes the sampler widen them to float32 first).
    SamplingParams(temperature=0.7, max_tokens=3, ignore_eos=True, seed=5),
)


def warmup_prompt_lengths(max_prompt_len: int) -> list[int]:
    """1 + each power of two up to max_prompt_len, then max_prompt_len itself."""
    lengths = []
    power = 1
    while power + 1 < max_prompt_len:
        lengths.append(power + 1)
        power *= 2
    lengths.append(max_prompt_len)
    return lengths


def warm_up(engine: WarmableEngine) -> int:
    """Run the warm-up requests to completion; returns the number of steps it took. The prefix
    cache is emptied afterwards, so no later request hits a warm-up block."""
    # Small steps with prompt tokens replay prefill graphs (their capture built their kernel
    # variants); the same steps run eagerly here, so the eager path's variants are built too
    # (a larger batch with a short prompt runs eagerly later).
    if engine.speculator is not None:
        engine.speculator.begin_warm_up()  # its drafted steps end with forget_warm_up
    graphs = engine.executor.graphs
    prefill_graphs = graphs.prefill if graphs is not None else None
    if graphs is not None:
        graphs.prefill = None
    try:
        return _warm_up_steps(engine)
    finally:
        if graphs is not None:
            graphs.prefill = prefill_graphs


def _warm_up_steps(engine: WarmableEngine) -> int:
    scheduler_config = engine.config.scheduler
    max_prompt_len = min(scheduler_config.max_num_batched_tokens, engine.max_model_len - 4)
    rng = random.Random(0)
    num_steps = 0
    for index, length in enumerate(warmup_prompt_lengths(max_prompt_len)):
        prompt = [rng.randrange(engine.vocab_size) for _ in range(length)]
        engine.add_request(
            EngineCoreRequest(
                request_id=f"__warmup_{index}",
                prompt_token_ids=prompt,
                sampling_params=WARMUP_PARAMS[index % len(WARMUP_PARAMS)],
                eos_token_ids=(0,),
            )
        )
        engine.step()
        num_steps += 1
    num_steps += _run_to_completion(engine)
    full_batch_params = [
        dataclasses.replace(params, max_tokens=2, min_tokens=0) for params in WARMUP_PARAMS
    ]
    for index in range(scheduler_config.max_num_seqs):
        engine.add_request(
            EngineCoreRequest(
                request_id=f"__warmup_batch_{index}",
                prompt_token_ids=[rng.randrange(engine.vocab_size) for _ in range(2)],
                sampling_params=full_batch_params[index % len(full_batch_params)],
                eos_token_ids=(0,),
            )
        )
    num_steps += _run_to_completion(engine)
    if engine.speculator is not None:
        num_steps += _warm_up_drafted_steps(engine, engine.speculator, rng)
    manager = engine.kv_cache_manager
    manager.reset_prefix_cache()  # both tiers: the idle flush settled the last copies
    manager.prefix_cache_queries = manager.prefix_cache_hits = 0
    manager.host_cache_queries = manager.host_cache_hits = 0
    return num_steps


# A drafting request's prompt: this pattern repeated, so every n-gram suffix has an earlier match.
DRAFTING_PATTERN_LEN = 4
DRAFTING_PATTERN_REPEATS = 8


def _warm_up_drafted_steps(
    engine: WarmableEngine, speculator: Speculator, rng: random.Random
) -> int:
    """One drafting request alone, then one per sampling feature together, each decoding for
    several drafted steps; then the speculator forgets the warm-up."""
    k = speculator.config.num_speculative_tokens
    decode_tokens = 3 * (k + 1) + 2  # a few verify steps even when every draft is accepted
    repeats = min(
        DRAFTING_PATTERN_REPEATS,
        (engine.max_model_len - decode_tokens - 1) // DRAFTING_PATTERN_LEN,
    )
    if repeats < 2:
        return 0  # a context too short to draft in: nothing to build
    num_steps = 0
    for batch, params_list in enumerate(([WARMUP_PARAMS[0]], list(WARMUP_PARAMS))):
        for index, params in enumerate(params_list):
            pattern = [rng.randrange(1, engine.vocab_size) for _ in range(DRAFTING_PATTERN_LEN)]
            engine.add_request(
                EngineCoreRequest(
                    request_id=f"__warmup_drafts_{batch}_{index}",
                    prompt_token_ids=pattern * repeats,
                    sampling_params=dataclasses.replace(
                        params, max_tokens=decode_tokens, min_tokens=0, ignore_eos=True
                    ),
                    eos_token_ids=(0,),
                )
            )
        num_steps += _run_to_completion(engine)
    speculator.forget_warm_up()
    return num_steps


def _run_to_completion(engine: WarmableEngine) -> int:
    num_steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        num_steps += 1
    return num_steps


def describe_startup(engine: WarmableEngine, num_warmup_steps: int, warmup_seconds: float) -> str:
    """One line for the start-up log: warm-up, graph capture, and the Triton builds so far."""
    parts = [f"warm-up: {num_warmup_steps} steps in {warmup_seconds:.1f} s"]
    graphs = engine.executor.graphs
    if graphs is not None:
        parts.append(
            f"{len(graphs.batch_sizes)} decode graphs and {graphs.num_prefill_graphs} prefill "
            f"graphs captured in {graphs.capture_seconds:.1f} s ({graphs.capture_times.describe()})"
        )
    totals = compile_totals()
    if totals is not None:
        parts.append(totals.describe())
    return "; ".join(parts)
