"""The perplexity bench's pieces: simulated quantizers and the tolerant ShareGPT reader."""

from __future__ import annotations

import torch

from ladle.bench.perplexity import (
    _complete_records,
    fake_quantize_fp8,
    fake_quantize_int4,
    fake_quantize_int4_mse,
)


def _int4_reference(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """Group by group in a Python loop: min/max of each group, 16 levels between them."""
    output = torch.empty_like(weight)
    for row in range(weight.shape[0]):
        for start in range(0, weight.shape[1], group_size):
            group = weight[row, start : start + group_size]
            low, high = group.min(), group.max()
            scale = ((high - low) / 15).clamp(min=1e-12)
            codes = torch.round((group - low) / scale).clamp(0, 15)
            output[row, start : start + group_size] = codes * scale + low
    return output


def test_int4_simulation_matches_loop_reference_with_a_short_last_group():
    weight = torch.randn(7, 200, generator=torch.Generator().manual_seed(0))  # 200 = 128 + 72
    torch.testing.assert_close(fake_quantize_int4(weight, 128), _int4_reference(weight, 128))
    one_row = weight[:1, :1]
    torch.testing.assert_close(fake_quantize_int4(one_row, 128), one_row)


def test_fp8_simulation_keeps_relative_error_of_e4m3():
    weight = torch.randn(33, 65, generator=torch.Generator().manual_seed(1))
    error = (fake_quantize_fp8(weight) - weight).abs()
    row_max = weight.abs().amax(dim=1, keepdim=True)
    # e4m3 has 3 mantissa bits: relative rounding error <= 1/16, absolute floor at subnormals.
    assert torch.all(error <= weight.abs() / 16 + row_max / 448 * 2**-9 + 1e-7)


def test_int4_mse_clipping_is_rtn_with_at_most_plain_rtn_error_per_group():
    """The clipping search keeps 16 evenly spaced levels per group (still round-to-nearest) and
    never does worse than the full range, group by group; on heavy-tailed rows it does better."""
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(16, 300, generator=generator) ** 3  # heavy tails, a short last group
    plain, searched = fake_quantize_int4(weight, 128), fake_quantize_int4_mse(weight, 128)
    for start in range(0, 300, 128):
        group = slice(start, min(start + 128, 300))
        plain_error = ((plain[:, group] - weight[:, group]) ** 2).sum(1)
        searched_error = ((searched[:, group] - weight[:, group]) ** 2).sum(1)
        assert torch.all(searched_error <= plain_error * (1 + 1e-5))
        for row in searched[:, group]:
            levels = row.unique()
            assert len(levels) <= 16
            steps = levels.diff()
            if len(steps):
                # Evenly spaced: every gap a whole multiple of the smallest.
                ratio = steps / steps.min()
                assert torch.allclose(ratio, ratio.round(), atol=1e-3)
    assert ((searched - weight) ** 2).sum() < 0.9 * ((plain - weight) ** 2).sum()


def test_truncated_json_array_keeps_complete_records():
    text = '[{"id": 1}, {"id": 2},\n {"id": "thr'
    assert _complete_records(text) == [{"id": 1}, {"id": 2}]
    assert _complete_records('[{"id": 1}]') == [{"id": 1}]
