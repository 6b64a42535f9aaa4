"""The counter-based RNG: uniform, unbiased, uncorrelated, and a pure function of its counter."""

import math

import torch

from ladle.sample.rng import counter_gumbels, counter_hash, counter_uniforms, mix32


def _grid(num_seeds: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    seeds = torch.arange(num_seeds, dtype=torch.int32)
    return seeds, torch.full((num_seeds,), step, dtype=torch.int32)


def _chi_square_critical(degrees_of_freedom: int, z: float = 4.26) -> float:
    """Wilson-Hilferty upper quantile of chi-square (z = 4.26: p ~ 1e-5)."""
    k = degrees_of_freedom
    return k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3


def test_uniforms_lie_in_open_unit_interval() -> None:
    seeds = torch.tensor([0, 1, 2**31 - 1, 12345], dtype=torch.int32)
    steps = torch.tensor([0, 2**31 - 1, 7, 0], dtype=torch.int32)
    u = counter_uniforms(seeds, steps, 5000)
    assert u.dtype == torch.float32 and u.shape == (4, 5000)
    assert bool((u > 0).all()) and bool((u < 1).all())


def test_uniform_mean_and_histogram_show_no_bias() -> None:
    u = counter_uniforms(*_grid(2000, step=3), 1000).double().flatten()
    n = u.numel()
    # The mean of n uniforms has sd sqrt(1/12n); a bias of 1e-3 (e.g. from dropping a bit) fails.
    assert abs(u.mean().item() - 0.5) < 4 * math.sqrt(1 / 12 / n)
    assert abs(u.var().item() - 1 / 12) < 4 * math.sqrt(1 / 180 / n)
    num_bins = 200
    counts = torch.histc(u, bins=num_bins, min=0.0, max=1.0)
    expected = n / num_bins
    chi_square = ((counts - expected) ** 2 / expected).sum().item()
    assert chi_square < _chi_square_critical(num_bins - 1), chi_square
    # The near-0 tail feeds the Gumbel's upper tail, which decides rare tokens: check it too.
    tail = (u < 1e-3).double().mean().item()
    assert abs(tail - 1e-3) < 4 * math.sqrt(1e-3 / n)


def test_every_hash_bit_is_fair() -> None:
    hashes = counter_hash(*_grid(250, step=11), 1000)
    bits = (hashes[..., None] >> torch.arange(32)) & 1
    frequencies = bits.double().mean(dim=(0, 1))
    assert float((frequencies - 0.5).abs().max()) < 4 * 0.5 / math.sqrt(hashes.numel())


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a = a.double().flatten() - a.double().mean()
    b = b.double().flatten() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_neighbouring_tokens_seeds_and_steps_are_uncorrelated() -> None:
    seeds, steps = _grid(1001, step=5)
    u = counter_uniforms(seeds, steps, 1001)
    next_step = counter_uniforms(seeds, steps + 1, 1001)
    bound = 5 / math.sqrt(1000 * 1000)
    assert abs(_correlation(u[:, :-1], u[:, 1:])) < bound  # token t vs t + 1
    assert abs(_correlation(u[:-1], u[1:])) < bound  # seed s vs s + 1
    assert abs(_correlation(u, next_step)) < bound  # step t vs t + 1


def test_same_counter_same_noise_whatever_the_batch() -> None:
    seeds = torch.tensor([7, 99, 123456, 7], dtype=torch.int32)
    steps = torch.tensor([3, 0, 42, 4], dtype=torch.int32)
    batch = counter_uniforms(seeds, steps, 300)
    for row in range(4):
        alone = counter_uniforms(seeds[row : row + 1], steps[row : row + 1], 300)
        assert torch.equal(alone[0], batch[row])
    assert not torch.equal(batch[0], batch[3])  # same seed, next step


def test_seed_and_step_are_not_interchangeable() -> None:
    five, nine = torch.tensor([5], dtype=torch.int32), torch.tensor([9], dtype=torch.int32)
    assert not torch.equal(counter_uniforms(five, nine, 64), counter_uniforms(nine, five, 64))


def test_mix32_is_a_bijection_on_a_sample() -> None:
    x = torch.arange(0, 2**32, 2**32 // 100_003, dtype=torch.int64)
    y = mix32(x)
    assert bool((y >= 0).all()) and bool((y < 2**32).all())
    assert torch.unique(y).numel() == x.numel()


def test_gumbels_are_finite_with_gumbel_moments() -> None:
    g = counter_gumbels(*_grid(1000, step=1), 1000).double()
    assert bool(torch.isfinite(g).all())
    euler_gamma = 0.5772156649
    n = g.numel()
    sd = math.pi / math.sqrt(6)
    assert abs(g.mean().item() - euler_gamma) < 5 * sd / math.sqrt(n)
    assert abs(g.std().item() - sd) < 0.01
