"""The sampler's random draw in one pass: argmax(logits / temperature + gumbel(seed, step, token)).

The torch path (sample/rng.py, then add and argmax) materialises several int64 and float32
[num_reqs, vocab] tensors to hash the counters; this kernel hashes each (row key, token) pair in
registers while it reads the logits once. The noise is the same function, bit for bit: the same
32-bit mixer (uint32 arithmetic wraps mod 2**32 exactly as rng.py's masked int64 products do),
the same float32 steps, and libdevice's log1p/log, which are the functions torch's CUDA kernels
call. The division by temperature is IEEE (div_rn), as torch's. Ties go to the lowest token id,
as torch.argmax. The per-row part of the hash (seed, step) is computed by rng.counter_row_keys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ladle.sample import rng

# Kernels may read module globals only as constexprs.
_MULTIPLIER_1 = tl.constexpr(rng._MULTIPLIER_1)
_MULTIPLIER_2 = tl.constexpr(rng._MULTIPLIER_2)


@triton.jit
def _mix32(x):
    x = x ^ (x >> 16)
    x = x * tl.full(x.shape, _MULTIPLIER_1, tl.uint32)
    x = x ^ (x >> 15)
    x = x * tl.full(x.shape, _MULTIPLIER_2, tl.uint32)
    return x ^ (x >> 16)


@triton.jit
def _gumbel_argmax_kernel(
    output_ptr,
    noise_ptr,
    logits_ptr,
    row_keys_ptr,
    temperature_ptr,
    vocab_size,
    stride_logits,
    TOKEN_SALT: tl.constexpr,
    MAX_UNIFORM: tl.constexpr,
    BLOCK: tl.constexpr,
    DIVIDE: tl.constexpr,
    WRITE_NOISE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    row_key = tl.load(row_keys_ptr + row).to(tl.uint32)
    if DIVIDE:
        temperature = tl.load(temperature_ptr + row).to(tl.float32)
    best_value = tl.full([BLOCK], float("-inf"), tl.float32)
    best_token = tl.zeros([BLOCK], tl.int32)
    for start in range(0, vocab_size, BLOCK):
        tokens = start + tl.arange(0, BLOCK)
        is_token = tokens < vocab_size
        logits = tl.load(
            logits_ptr + row * stride_logits + tokens, mask=is_token, other=float("-inf")
        ).to(tl.float32)
        if DIVIDE:
            logits = tl.math.div_rn(logits, temperature)
        token_keys = _mix32(tokens.to(tl.uint32) ^ tl.full([BLOCK], TOKEN_SALT, tl.uint32))
        hashes = _mix32(row_key ^ token_keys)
        uniforms = tl.minimum((hashes.to(tl.float32) + 0.5) * 2.3283064365386963e-10, MAX_UNIFORM)
        exponentials = -libdevice.log1p(-uniforms)
        gumbels = -libdevice.log(exponentials)
        if WRITE_NOISE:
            tl.store(noise_ptr + row * vocab_size + tokens, gumbels, mask=is_token)
        values = tl.where(is_token, logits + gumbels, float("-inf"))
        # Strictly greater: each lane keeps its earliest token among equal values.
        is_better = values > best_value
        best_value = tl.where(is_better, values, best_value)
        best_token = tl.where(is_better, tokens, best_token)
    row_best = tl.max(best_value, axis=0)
    candidates = tl.where(best_value == row_best, best_token, vocab_size)
    tl.store(output_ptr + row, tl.min(candidates, axis=0).to(tl.int64))


def gumbel_argmax(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
    temperature: torch.Tensor | None = None,
    *,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """int64 [num_reqs]: argmax over the vocabulary of logits (/ temperature) + counter gumbels.

    logits [num_reqs, vocab] (any float dtype, unit stride on vocab) is not modified. noise, if
    given (float32 [num_reqs, vocab], contiguous), receives the gumbel noise (for tests).
    """
    num_reqs, vocab_size = logits.shape
    assert logits.stride(1) == 1, "the vocabulary dim must be contiguous"
    output = torch.empty(num_reqs, dtype=torch.int64, device=logits.device)
    if num_reqs == 0:
        return output
    row_keys = rng.counter_row_keys(seeds, steps)
    _gumbel_argmax_kernel[(num_reqs,)](
        output,
        noise if noise is not None else logits,
        logits,
        row_keys,
        temperature if temperature is not None else logits,
        vocab_size,
        logits.stride(0),
        TOKEN_SALT=rng._TOKEN_SALT,
        MAX_UNIFORM=rng._MAX_UNIFORM,
        BLOCK=2048,
        DIVIDE=temperature is not None,
        WRITE_NOISE=noise is not None,
        num_warps=8,
    )
    return output
