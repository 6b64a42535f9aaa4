"""The batch-1 GEMV's RMSNorm prologue (kernels/gemv.py) under Triton's interpreter on the CPU:
gemv given a norm weight (and a residual) multiplies the normalised row, against
torch's add, RMSNorm and matmul in float64, at Ks that are and are not powers of two up to the
one 2048-wide tile the prologue takes; the new residual stream goes to its own buffer and the
inputs are left alone.

Skipped where Triton is not installed. The interpreter runs float32 tensors (numpy has no
bfloat16), so the roundings to bf16 are no-ops here, and has no libdevice (gate_up_silu's SiLU);
the bf16 runs of both kernels against the separate norm kernel are in tests/gpu/test_gemv.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers.interpreter import interpreted, parent_only, run_in_interpreter_child

pytest.importorskip("triton")


@parent_only
def test_kernels_under_the_interpreter():
    run_in_interpreter_child(__file__)


EPS = 1e-6


def _operands(n: int, k: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, k, generator=generator)
    residual = torch.randn(1, k, generator=generator)
    norm_weight = torch.rand(k, generator=generator) + 0.5
    weight = torch.randn(n, k, generator=generator) / k**0.5
    return x, residual, norm_weight, weight


def _normalized(row: torch.Tensor, norm_weight: torch.Tensor) -> torch.Tensor:
    row = row.double()
    inverse_rms = torch.rsqrt(row.pow(2).mean(-1, keepdim=True) + EPS)
    return row * inverse_rms * norm_weight.double()


@interpreted
@pytest.mark.parametrize("n,k", [(37, 1024), (9, 2000), (6, 576), (5, 3)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_gemv_multiplies_the_normalised_row(n, k, with_residual):
    from ladle.kernels.gemv import gemv

    x, residual, norm_weight, weight = _operands(n, k, seed=n * 7 + k)
    inputs = (x.clone(), residual.clone())
    new_residual = torch.full_like(x, float("nan")) if with_residual else None
    got = gemv(
        x,
        weight,
        norm_weight=norm_weight,
        eps=EPS,
        residual=residual if with_residual else None,
        new_residual=new_residual,
    )
    summed = x + residual if with_residual else x
    expected = _normalized(summed, norm_weight) @ weight.double().t()
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)
    if with_residual:
        assert torch.equal(new_residual, summed)
    # The prologue reads x and the residual and writes neither.
    assert torch.equal(x, inputs[0]) and torch.equal(residual, inputs[1])
    # Without the prologue the same kernel multiplies x itself.
    plain = gemv(x, weight)
    torch.testing.assert_close(plain.double(), x.double() @ weight.double().t(), rtol=1e-5, atol=1e-5)


@interpreted
def test_the_new_residual_must_be_a_separate_buffer():
    """Every program reads the residual while the first writes the sum: in place would race."""
    from ladle.kernels.gemv import gemv

    x, residual, norm_weight, weight = _operands(4, 64, seed=1)
    for aliased in (residual, x, None):
        with pytest.raises(ValueError, match="separate new_residual"):
            gemv(x, weight, norm_weight=norm_weight, eps=EPS, residual=residual, new_residual=aliased)


@interpreted
def test_a_row_wider_than_one_tile_is_refused():
    """The norm needs the whole row before the first product: one K tile (2048) at most."""
    from ladle.kernels.gemv import gemv, norm_prologue_applies

    x, residual, norm_weight, weight = _operands(4, 4096, seed=2)
    assert not norm_prologue_applies(x, norm_weight, residual)
    assert norm_prologue_applies(x[:, :2048], norm_weight[:2048], residual[:, :2048])
    with pytest.raises(ValueError, match="up to 2048 wide"):
        gemv(x, weight, norm_weight=norm_weight, eps=EPS)
