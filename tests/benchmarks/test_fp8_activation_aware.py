"""The least-squares weight for quantized inputs (benchmarks/fp8_activation_aware.py) against the
float weight, on inputs whose fp8 rounding is real."""

from __future__ import annotations

import torch
from fp8_ablation import fake_fp8
from fp8_activation_aware import least_squares_weight


def test_least_squares_weight_lowers_the_error_of_quantized_inputs():
    generator = torch.Generator().manual_seed(0)
    mixing = torch.eye(48) + 0.5 * torch.randn(48, 48, generator=generator)
    inputs = torch.randn(4096, 48, generator=generator) @ mixing
    inputs[:, 3] *= 30  # an outlier channel: every other channel's rounding grows with it
    weight = torch.randn(16, 48, generator=generator)
    rounded = fake_fp8(inputs)
    corrected = least_squares_weight(weight, rounded.t() @ rounded, inputs.t() @ rounded)
    reference = inputs @ weight.t()
    plain_error = (rounded @ weight.t() - reference).norm()
    corrected_error = (rounded @ corrected.t() - reference).norm()
    # The rounding is close to noise, so the least-squares fit gains little, but it gains.
    assert corrected_error < 0.99 * plain_error
    # Exact inputs need no correction: the solve gives the weight's outputs back (up to the
    # damping; the weight itself only where the inputs determine it).
    exact = least_squares_weight(weight, inputs.t() @ inputs, inputs.t() @ inputs)
    assert (inputs @ exact.t() - reference).norm() < 1e-3 * reference.norm()
