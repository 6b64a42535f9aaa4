"""Seeded frequency tests: 20k draws against the exact processed distribution (float64 numpy).

Every case also checks that the test has teeth: the distribution a plausible bug would give
(temperature ignored, top-p or top-k off by one token, min-p against the wrong reference) must
fail the same bound.
"""

import math

import numpy as np
import pytest
import torch

from ladle.sample import Sampler, build_sampling_metadata
from ladle.sampling.params import SamplingParams

NUM_DRAWS = 20_000
# Designed so no truncation boundary is near a tie; shuffled so the sort-and-scatter back matters.
BASE_PROBS = np.array([0.3, 0.2, 0.15, 0.1, 0.08, 0.06, 0.04, 0.03, 0.02, 0.01, 0.007, 0.003])
PERMUTATION = np.array([7, 2, 10, 0, 5, 11, 3, 8, 1, 6, 9, 4])
LOGITS = np.empty_like(BASE_PROBS)
LOGITS[PERMUTATION] = np.log(BASE_PROBS) + 1.7  # an offset: logits are not logprobs


def _chi_square_critical(degrees_of_freedom: int, z: float = 3.72) -> float:
    """Wilson-Hilferty upper quantile of chi-square (z = 3.72: p ~ 1e-4)."""
    k = degrees_of_freedom
    return k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3


def reference_distribution(
    logits: np.ndarray,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
    min_p: float = 0.0,
    top_k_off_by: int = 0,
    top_p_off_by: int = 0,
) -> np.ndarray:
    """The exact distribution: temperature -> min-p -> top-k -> top-p, in float64.

    The *_off_by arguments build the distribution a buggy sampler would draw from.
    """
    probs = np.exp((logits - logits.max()) / temperature)
    probs /= probs.sum()
    keep = probs >= min_p * probs.max()
    if min_p > 0:
        margins = np.abs(probs - min_p * probs.max()) / probs.max()
        assert margins.min() > 1e-3, "min_p boundary too close to a token for a float32 sampler"
    order = np.argsort(-probs, kind="stable")
    if top_k > 0:
        keep[order[top_k + top_k_off_by :]] = False
    probs = np.where(keep, probs, 0.0)
    probs /= probs.sum()
    if top_p < 1.0:
        sorted_probs = probs[order]
        mass_before = np.cumsum(sorted_probs) - sorted_probs
        assert np.abs(mass_before[sorted_probs > 0] - top_p).min() > 1e-3, "top_p boundary tie"
        num_kept = int((mass_before < top_p).sum()) + top_p_off_by
        keep = np.zeros_like(keep)
        keep[order[:num_kept]] = True
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum()
    return probs


def draw_counts(params: SamplingParams, *, vary: str = "seed") -> np.ndarray:
    """NUM_DRAWS draws as one batch of identical rows that differ in seed (or in step)."""
    index = list(range(NUM_DRAWS))
    seeds = index if vary == "seed" else [1234] * NUM_DRAWS
    steps = [17] * NUM_DRAWS if vary == "seed" else index
    metadata = build_sampling_metadata([params] * NUM_DRAWS, seeds, steps, vocab_size=len(LOGITS))
    logits = torch.tensor(LOGITS, dtype=torch.float32).expand(NUM_DRAWS, -1).contiguous()
    sampled = Sampler()(logits, metadata).sampled_token_ids
    return np.bincount(sampled.numpy(), minlength=len(LOGITS))


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square of counts against probs; inf if a token of probability 0 was drawn."""
    if counts[probs == 0].sum() > 0:
        return math.inf
    expected = probs[probs > 0] * counts.sum()
    return float(((counts[probs > 0] - expected) ** 2 / expected).sum())


def assert_matches(counts: np.ndarray, probs: np.ndarray, *wrong: np.ndarray) -> None:
    critical = _chi_square_critical(max(int((probs > 0).sum()) - 1, 1))
    statistic = chi_square(counts, probs)
    assert statistic < critical, f"chi-square {statistic:.1f} >= {critical:.1f}: {counts}"
    for wrong_probs in wrong:
        assert chi_square(counts, wrong_probs) > critical, "the test cannot tell the bug apart"


CASES = {
    "plain": (dict(temperature=1.0), dict(), [dict(temperature=0.7)]),
    "temperature_0.7": (dict(temperature=0.7), dict(), [dict(temperature=1.0)]),
    "temperature_1.6": (dict(temperature=1.6), dict(), [dict(temperature=1.0)]),
    "top_k_4": (
        dict(top_k=4), dict(), [dict(top_k=4, top_k_off_by=1), dict(top_k=4, top_k_off_by=-1)]
    ),
    "top_p_0.8": (
        dict(top_p=0.8), dict(), [dict(top_p=0.8, top_p_off_by=1), dict(top_p=0.8, top_p_off_by=-1)]
    ),
    "min_p_0.12": (dict(min_p=0.12), dict(), [dict(min_p=0.09), dict(min_p=0.15)]),
    "temperature_top_p": (
        dict(temperature=0.7, top_p=0.9),
        dict(),
        [dict(temperature=1.0, top_p=0.9), dict(temperature=0.7, top_p=0.9, top_p_off_by=1)],
    ),
    "everything": (
        dict(temperature=1.3, min_p=0.06, top_k=7, top_p=0.9),
        dict(),
        [dict(temperature=1.0, min_p=0.06, top_k=7, top_p=0.9),
         dict(temperature=1.3, min_p=0.06, top_k=7, top_p=0.9, top_k_off_by=-1),
         dict(temperature=1.3, min_p=0.06, top_k=7, top_p=0.9, top_p_off_by=-1)],
    ),
    "min_p_then_top_p": (
        dict(temperature=1.3, min_p=0.2, top_p=0.95),
        dict(),
        [dict(temperature=1.3, min_p=0.1, top_p=0.95), dict(temperature=1.3, top_p=0.95)],
    ),
    "steps_not_seeds": (
        dict(temperature=0.9, top_k=6), dict(vary="step"), [dict(temperature=1.0, top_k=6)]
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_empirical_distribution_matches_reference(name: str) -> None:
    param_kwargs, draw_kwargs, wrong_kwargs = CASES[name]
    counts = draw_counts(SamplingParams(**param_kwargs), **draw_kwargs)
    reference_kwargs = {
        k: v for k, v in param_kwargs.items() if k in ("temperature", "top_k", "top_p", "min_p")
    }
    probs = reference_distribution(LOGITS, **reference_kwargs)
    assert_matches(counts, probs, *(reference_distribution(LOGITS, **w) for w in wrong_kwargs))


def test_rare_tokens_are_drawn_at_their_rate() -> None:
    # Gumbel-max resolution: a token 9 nats below the rest must still come up (~1.2e-4 each).
    logits = np.zeros(64)
    logits[1:] = -9.0
    probs = np.exp(logits) / np.exp(logits).sum()
    num_draws = 100_000
    metadata = build_sampling_metadata(
        [SamplingParams()] * num_draws, list(range(num_draws)), [0] * num_draws, vocab_size=64
    )
    tensor = torch.tensor(logits, dtype=torch.float32).expand(num_draws, -1)
    sampled = Sampler()(tensor, metadata).sampled_token_ids.numpy()
    rare = float((sampled != 0).mean())
    expected = 1 - probs[0]
    assert abs(rare - expected) < 4 * math.sqrt(expected / num_draws), (rare, expected)
