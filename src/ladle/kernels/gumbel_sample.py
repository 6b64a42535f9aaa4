"""The sampler's random draw in one pass: argmax(logits / temperature + gumbel(seed, step, token)).

The torch path (sample/rng.py, then add and argmax) materialises several int64 and float32
[num_reqs, vocab] tensors to hash the counters; this kernel hashes each (row key, token) pair in
registers while it reads the logits once. The noise is the same function, bit for bit: the same
32-bit mixer (uint32 arithmetic wraps mod 2**32 exactly as rng.py's masked int64 products do),
the same float32 steps, and libdevice's log1p/log, which are the functions torch's CUDA kernels
call. The division by temperature is IEEE (div_rn), as torch's. Ties go to the lowest token id,
as torch.argmax. The per-row part of the hash (rng.counter_row_keys) is computed in the kernel
too, so a draw is two launches whatever the batch: one program per (row, 8192 tokens), then a
merge of each row's partial winners.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ladle.kernels.launch import launch
from ladle.sample import rng

# Kernels may read module globals only as constexprs.
_MULTIPLIER_1 = tl.constexpr(rng._MULTIPLIER_1)
_MULTIPLIER_2 = tl.constexpr(rng._MULTIPLIER_2)
_SEED_SALT = tl.constexpr(rng._SEED_SALT)
_STEP_SALT = tl.constexpr(rng._STEP_SALT)
_TOKEN_SALT = tl.constexpr(rng._TOKEN_SALT)
_MAX_UNIFORM = tl.constexpr(rng._MAX_UNIFORM)
# Tokens per program: a row's vocabulary is spread over several programs so that one request
# (or a few) still fills the GPU; a second launch merges each row's partial winners.
_TOKENS_PER_PROGRAM = 8192
_BLOCK = 2048


@triton.jit
def _mix32(x):
    """rng.mix32 on uint32 values: products wrap mod 2**32 as rng's masked int64 products do."""
    x = x ^ (x >> 16)
    x = x * tl.full([1], _MULTIPLIER_1, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full([1], _MULTIPLIER_2, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _mix32_of_int64(x):
    """rng.mix32 of any int64 (its first shift sees all 64 bits; the product keeps 32)."""
    x = x ^ (x >> 16)
    x = x.to(tl.uint32) * tl.full([1], _MULTIPLIER_1, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full([1], _MULTIPLIER_2, tl.uint32)
    return x ^ (x >> 16)


@triton.jit(
    # Views into the step's packed sampling rows: their alignment follows the batch size.
    do_not_specialize_on_alignment=["seeds_ptr", "steps_ptr", "temperature_ptr"],
)
def _gumbel_argmax_partial_kernel(
    best_value_ptr,
    best_token_ptr,
    noise_ptr,
    logits_ptr,
    seeds_ptr,
    steps_ptr,
    temperature_ptr,
    vocab_size,
    stride_logits,
    num_chunks,
    TOKENS_PER_PROGRAM: tl.constexpr,
    BLOCK: tl.constexpr,
    DIVIDE: tl.constexpr,
    WRITE_NOISE: tl.constexpr,
    NOISE: tl.constexpr = True,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    if NOISE:
        # rng.counter_row_keys, per program: a handful of integer ops instead of ~30 tiny launches.
        seed = tl.load(seeds_ptr + row).to(tl.int64)
        step = tl.load(steps_ptr + row).to(tl.int64)
        row_key = _mix32(_mix32_of_int64(seed ^ _SEED_SALT) ^ _mix32_of_int64(step ^ _STEP_SALT))
    if DIVIDE:
        temperature = tl.load(temperature_ptr + row).to(tl.float32)
    best_value = tl.full([BLOCK], float("-inf"), tl.float32)
    best_token = tl.zeros([BLOCK], tl.int32)
    first = chunk * TOKENS_PER_PROGRAM
    for start in range(first, first + TOKENS_PER_PROGRAM, BLOCK):
        tokens = start + tl.arange(0, BLOCK)
        is_token = tokens < vocab_size
        logits = tl.load(
            logits_ptr + row * stride_logits + tokens, mask=is_token, other=float("-inf")
        ).to(tl.float32)
        if DIVIDE:
            logits = tl.math.div_rn(logits, temperature)
        if NOISE:
            token_keys = _mix32(tokens.to(tl.uint32) ^ tl.full([BLOCK], _TOKEN_SALT, tl.uint32))
            hashes = _mix32(row_key ^ token_keys)
            uniforms = tl.minimum(
                (hashes.to(tl.float32) + 0.5) * 2.3283064365386963e-10, _MAX_UNIFORM
            )
            exponentials = -libdevice.log1p(-uniforms)
            gumbels = -libdevice.log(exponentials)
            if WRITE_NOISE:
                tl.store(noise_ptr + row * vocab_size + tokens, gumbels, mask=is_token)
            values = tl.where(is_token, logits + gumbels, float("-inf"))
        else:
            values = logits
        # Strictly greater: each lane keeps its earliest token among equal values.
        is_better = values > best_value
        best_value = tl.where(is_better, values, best_value)
        best_token = tl.where(is_better, tokens, best_token)
    chunk_best = tl.max(best_value, axis=0)
    chunk_token = tl.min(tl.where(best_value == chunk_best, best_token, vocab_size), axis=0)
    tl.store(best_value_ptr + row * num_chunks + chunk, chunk_best)
    tl.store(best_token_ptr + row * num_chunks + chunk, chunk_token)


@triton.jit
def _merge_chunks_kernel(
    output_ptr, best_value_ptr, best_token_ptr, num_chunks, CHUNKS_PADDED: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    chunks = tl.arange(0, CHUNKS_PADDED)
    is_chunk = chunks < num_chunks
    values = tl.load(best_value_ptr + row * num_chunks + chunks, mask=is_chunk, other=float("-inf"))
    tokens = tl.load(best_token_ptr + row * num_chunks + chunks, mask=is_chunk, other=2**31 - 1)
    # Chunks are in token order, so the lowest token among the best values is torch's argmax;
    # a row of -inf only ends on token 0 (chunk 0's), as torch.argmax does.
    best = tl.max(values, axis=0)
    tl.store(output_ptr + row, tl.min(tl.where(values == best, tokens, 2**31 - 1), axis=0))


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """int64 [num_reqs]: torch.argmax(logits, -1) for finite and -inf logits (ties to the lowest
    token; NaN never wins, where torch's would), in the same two launches as the draw. torch's
    single-row reduction ran one block per row: 29 us for one 128k-vocabulary row on an H100,
    1% of an 8B int4 decode step; the vocabulary spread over programs takes a few."""
    return gumbel_argmax(logits, logits, logits, add_noise=False)


def gumbel_argmax(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    temperature: torch.Tensor | None = None,
    *,
    noise: torch.Tensor | None = None,
    add_noise: bool = True,
) -> torch.Tensor:
    """int64 [num_reqs]: argmax over the vocabulary of logits (/ temperature) + counter gumbels
    (without them when add_noise is False: seeds and steps are then not read).

    logits [num_reqs, vocab] (any float dtype, unit stride on vocab) is not modified. noise, if
    given (float32 [num_reqs, vocab], contiguous), receives the gumbel noise (for tests).
    """
    num_reqs, vocab_size = logits.shape
    assert logits.stride(1) == 1, "the vocabulary dim must be contiguous"
    output = torch.empty(num_reqs, dtype=torch.int64, device=logits.device)
    if num_reqs == 0:
        return output
    num_chunks = triton.cdiv(vocab_size, _TOKENS_PER_PROGRAM)
    best_values = torch.empty(num_reqs, num_chunks, dtype=torch.float32, device=logits.device)
    best_tokens = torch.empty(num_reqs, num_chunks, dtype=torch.int32, device=logits.device)
    launch(
        _gumbel_argmax_partial_kernel,
        (num_reqs, num_chunks),
        best_values,
        best_tokens,
        noise if noise is not None else best_values,
        logits,
        seeds,
        steps,
        temperature if temperature is not None else best_values,
        vocab_size,
        logits.stride(0),
        num_chunks,
        TOKENS_PER_PROGRAM=_TOKENS_PER_PROGRAM,
        BLOCK=_BLOCK,
        DIVIDE=temperature is not None,
        WRITE_NOISE=noise is not None,
        NOISE=add_noise,
        num_warps=8,
    )
    launch(
        _merge_chunks_kernel,
        (num_reqs,),
        output,
        best_values,
        best_tokens,
        num_chunks,
        CHUNKS_PADDED=triton.next_power_of_2(num_chunks),
        num_warps=1,
    )
    return output
