"""A counter-based random stream for sampling: noise is a pure function of (seed, step, token).

Why not a torch.Generator per request: a generator is host state, so seeding one per request means
a Python loop over the batch and one kernel launch per row, and a single shared generator makes a
request's samples depend on which other requests share its batch and on its row. Hashing the
counter instead gives every request its own stream with a handful of batched integer ops: the same
(seed, step) draws the same token whatever the batch looks like, no state to carry between steps,
no host sync, and it runs unchanged on any device.

The hash works on 32-bit values held in int64 tensors. Each multiplier is odd and below 2**31, so a
product of a 32-bit value and a multiplier stays below 2**63: no signed overflow (undefined in the
kernels' C++) ever happens, and masking keeps the low 32 bits. Every step of the mixer (xor-shift,
odd multiply mod 2**32) is a bijection on 32 bits; two rounds pass an avalanche test at the
noise floor of 200k samples.
"""

from __future__ import annotations

import torch

_MASK_32 = 0xFFFFFFFF
_MULTIPLIER_1 = 0x7FEB352D
_MULTIPLIER_2 = 0x5BD1E995
# Salts keep the seed, step and token streams apart: hash(seed=a, step=b) != hash(seed=b, step=a).
_SEED_SALT = 0x2545F491
_STEP_SALT = 0x1B873593
_TOKEN_SALT = 0x68E31DA4
# Largest float32 below 1: the uniform is clamped to it so -log1p(-u) is always finite.
_MAX_UNIFORM = 1.0 - 2.0**-24


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective avalanche mix of 32-bit values held in an int64 tensor (values in [0, 2**32))."""
    return _mix32_(x.clone())


def _mix32_(x: torch.Tensor) -> torch.Tensor:
    # In place, so the [num_reqs, vocab] hash holds at most two int64 tensors at a time.
    x ^= x >> 16
    x.mul_(_MULTIPLIER_1).bitwise_and_(_MASK_32)
    x ^= x >> 15
    x.mul_(_MULTIPLIER_2).bitwise_and_(_MASK_32)
    x ^= x >> 16
    return x


def counter_row_keys(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """The per-row half of counter_hash: int64 [num_reqs] 32-bit keys of (seed, step).

    Shared with the fused CUDA draw (kernels/gumbel_sample.py), which mixes in the token index.
    """
    seeds = seeds.to(torch.int64)
    steps = steps.to(torch.int64)
    return mix32(mix32(seeds ^ _SEED_SALT) ^ mix32(steps ^ _STEP_SALT))


def counter_hash(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """32-bit hashes, int64 [num_reqs, vocab_size], of (seed, step, token index).

    seeds and steps are [num_reqs] non-negative int tensors (int32 rows are fine). The step and the
    token index are hashed before they are combined, so two requests whose seeds differ never see
    each other's stream shifted by a few steps or tokens (as a plain counter sum would give).
    """
    row_keys = counter_row_keys(seeds, steps)
    token_ids = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    token_keys = mix32(token_ids ^ _TOKEN_SALT)
    return _mix32_(row_keys[:, None] ^ token_keys[None, :])


def counter_uniforms(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Uniforms in (0, 1), float32 [num_reqs, vocab_size], a pure function of (seed, step, token).

    All 32 hash bits are used: float32 keeps them exactly near 0, which is where the sampler needs
    resolution (it turns u into the exponential -log(1 - u), whose small values decide whether an
    unlikely token wins).
    """
    hashes = counter_hash(seeds, steps, vocab_size)
    uniforms = (hashes.to(torch.float32) + 0.5) * 2.0**-32
    return uniforms.clamp_(max=_MAX_UNIFORM)


def counter_gumbels(seeds: torch.Tensor, steps: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise, float32 [num_reqs, vocab_size]: -log(E) with E = -log(1 - u) ~ Exp(1).

    argmax(logits + gumbel) draws from softmax(logits): the exponential race
    argmax(probs / E) taken in log space, so no softmax is needed and -inf logits stay -inf.
    Finite everywhere: E lies in [2**-33, 16.7].
    """
    uniforms = counter_uniforms(seeds, steps, vocab_size)
    exponentials = torch.log1p(uniforms.neg_()).neg_()
    return exponentials.log_().neg_()


# Keeps the acceptance stream apart from every (seed, step, token) noise draw of the same row.
_ACCEPTANCE_SALT = 0x3C6EF372


def counter_row_uniforms(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """One uniform in (0, 1) per row, float32 [num_reqs], a pure function of (seed, step) and
    independent of the row's token noise (speculative decoding's acceptance test)."""
    keys = mix32(counter_row_keys(seeds, steps) ^ _ACCEPTANCE_SALT)
    return ((keys.to(torch.float32) + 0.5) * 2.0**-32).clamp_(max=_MAX_UNIFORM)
