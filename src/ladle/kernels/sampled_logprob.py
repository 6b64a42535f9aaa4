"""The sampled token's logprob and rank (`logprobs: 0`) without a full-vocabulary log-softmax.

Every token-id stream of `ladle bench serve` asks for the sampled token's logprob (so that each
token is a chunk of its own). The torch path (sample/logprobs.py) widens the logits to float32,
takes torch.log_softmax over the whole vocabulary, gathers, compares and sums: seven launches a
step, and torch's softmax runs one block per row, so at batch 1 a 151,936-token row is read
three times and written once by one SM (its single-row argmax took 29 us on an H100 for one
pass; gumbel_sample.py). Here the row is spread over programs of TOKENS_PER_PROGRAM tokens, as
gumbel_sample.py spreads the draw, in two launches that read the logits in any float dtype:

1. per (row, chunk): the chunk's max m and sum of exp(x - m); chunk 0 also sets the row's
   rank to 1.
2. per (row, chunk): the row's max M and sum S = sum over chunks of s * exp(m - M), combined
   in chunk order (every program of a row gets the same bits), the sampled token's logprob
   (x_s - M) - log S, and the chunk's count of tokens whose (x - M) - log S is strictly
   greater, added to the rank (integer atomics: exact in any order). Chunk 0 writes the logprob.

The formula is torch's log_softmax, (x - max) - log(sum(exp(x - max))), with the exponentials in
libdevice's full-precision expf; only the sum's order differs from torch's block reduction, so a
logprob may differ from torch's in its last bits (tests/gpu/test_fused_kernels.py bounds it),
and the rank counts tokens strictly more likely under this same rounding, as the torch path does
under its own. Ties share the best rank.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ladle.kernels.launch import launch

# Tokens per program: one request (or a few) still spreads over many SMs; gumbel_sample.py's.
_TOKENS_PER_PROGRAM = 8192
_BLOCK = 2048
# Triton's interpreter (the CPU tests) has no libdevice; there tl.exp and tl.log stand in.
_LIBDEVICE = os.environ.get("TRITON_INTERPRET") != "1"


@triton.jit
def _exp(x, LIBDEVICE: tl.constexpr):
    # libdevice's expf, as torch's CUDA softmax calls it (tl.exp is ex2.approx on float32).
    if LIBDEVICE:
        return libdevice.exp(x)
    return tl.exp(x)


@triton.jit
def _log(x, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.log(x)
    return tl.log(x)


@triton.jit
def _chunk_sums_kernel(
    chunk_max_ptr,
    chunk_sum_ptr,
    rank_ptr,
    logits_ptr,
    vocab_size,
    stride_logits,
    num_chunks,
    TOKENS_PER_PROGRAM: tl.constexpr,
    BLOCK: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    first = chunk * TOKENS_PER_PROGRAM
    # Two passes over the chunk (16-32 KB): its max, then the sum of exp(x - max); an online
    # max would rescale lanes that saw nothing but -inf (exp(-inf - -inf) is NaN).
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(first, first + TOKENS_PER_PROGRAM, BLOCK):
        tokens = start + tl.arange(0, BLOCK)
        values = tl.load(
            logits_ptr + row * stride_logits + tokens, mask=tokens < vocab_size,
            other=float("-inf"),
        ).to(tl.float32)
        lane_max = tl.maximum(lane_max, values)
    chunk_max = tl.max(lane_max, axis=0)
    lane_sum = tl.zeros([BLOCK], tl.float32)
    if chunk_max > float("-inf"):
        for start in range(first, first + TOKENS_PER_PROGRAM, BLOCK):
            tokens = start + tl.arange(0, BLOCK)
            values = tl.load(
                logits_ptr + row * stride_logits + tokens, mask=tokens < vocab_size,
                other=float("-inf"),
            ).to(tl.float32)
            lane_sum += _exp(values - chunk_max, LIBDEVICE)
    tl.store(chunk_max_ptr + row * num_chunks + chunk, chunk_max)
    tl.store(chunk_sum_ptr + row * num_chunks + chunk, tl.sum(lane_sum, axis=0))
    if chunk == 0:
        tl.store(rank_ptr + row, 1)  # the launch after this one adds the better tokens


@triton.jit
def _logprob_and_rank_kernel(
    logprob_ptr,
    rank_ptr,
    chunk_max_ptr,
    chunk_sum_ptr,
    logits_ptr,
    sampled_ptr,
    vocab_size,
    stride_logits,
    num_chunks,
    TOKENS_PER_PROGRAM: tl.constexpr,
    BLOCK: tl.constexpr,
    CHUNKS_PADDED: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    chunks = tl.arange(0, CHUNKS_PADDED)
    is_chunk = chunks < num_chunks
    maxes = tl.load(
        chunk_max_ptr + row * num_chunks + chunks, mask=is_chunk, other=float("-inf")
    )
    sums = tl.load(chunk_sum_ptr + row * num_chunks + chunks, mask=is_chunk, other=0.0)
    row_max = tl.max(maxes, axis=0)
    scaled = tl.where(maxes > float("-inf"), sums * _exp(maxes - row_max, LIBDEVICE), 0.0)
    log_sum = _log(tl.sum(scaled, axis=0), LIBDEVICE)
    sampled = tl.load(sampled_ptr + row).to(tl.int64)
    sampled_logit = tl.load(logits_ptr + row * stride_logits + sampled).to(tl.float32)
    sampled_logprob = (sampled_logit - row_max) - log_sum
    num_better = tl.zeros([BLOCK], tl.int32)
    first = chunk * TOKENS_PER_PROGRAM
    for start in range(first, first + TOKENS_PER_PROGRAM, BLOCK):
        tokens = start + tl.arange(0, BLOCK)
        values = tl.load(
            logits_ptr + row * stride_logits + tokens, mask=tokens < vocab_size,
            other=float("-inf"),
        ).to(tl.float32)
        num_better += ((values - row_max) - log_sum > sampled_logprob).to(tl.int32)
    tl.atomic_add(rank_ptr + row, tl.sum(num_better, axis=0).to(tl.int64))
    if chunk == 0:
        tl.store(logprob_ptr + row, sampled_logprob)


def sampled_logprob_and_rank(
    logits: torch.Tensor, sampled_token_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token ids int64 [num_reqs, 1], logprobs float32 [num_reqs, 1], ranks int64 [num_reqs]),
    as sample/logprobs.py's gather_logprobs(torch.log_softmax(logits.float()), sampled, 0)
    gives them (see the module docstring for the last bits), in two launches.

    logits [num_reqs, vocab] (any float dtype, unit stride on vocab) is not modified.
    """
    num_reqs, vocab_size = logits.shape
    assert logits.stride(1) == 1, "the vocabulary dim must be contiguous"
    device = logits.device
    token_ids = sampled_token_ids.to(torch.int64)[:, None]
    logprobs = torch.empty(num_reqs, 1, dtype=torch.float32, device=device)
    ranks = torch.empty(num_reqs, dtype=torch.int64, device=device)
    if num_reqs == 0:
        return token_ids, logprobs, ranks
    num_chunks = triton.cdiv(vocab_size, _TOKENS_PER_PROGRAM)
    chunk_max = torch.empty(num_reqs, num_chunks, dtype=torch.float32, device=device)
    chunk_sum = torch.empty(num_reqs, num_chunks, dtype=torch.float32, device=device)
    launch(
        _chunk_sums_kernel,
        (num_reqs, num_chunks),
        chunk_max,
        chunk_sum,
        ranks,
        logits,
        vocab_size,
        logits.stride(0),
        num_chunks,
        TOKENS_PER_PROGRAM=_TOKENS_PER_PROGRAM,
        BLOCK=_BLOCK,
        LIBDEVICE=_LIBDEVICE,
        num_warps=8,
    )
    launch(
        _logprob_and_rank_kernel,
        (num_reqs, num_chunks),
        logprobs,
        ranks,
        chunk_max,
        chunk_sum,
        logits,
        token_ids,
        vocab_size,
        logits.stride(0),
        num_chunks,
        TOKENS_PER_PROGRAM=_TOKENS_PER_PROGRAM,
        BLOCK=_BLOCK,
        CHUNKS_PADDED=triton.next_power_of_2(num_chunks),
        LIBDEVICE=_LIBDEVICE,
        num_warps=8,
    )
    return token_ids, logprobs, ranks
