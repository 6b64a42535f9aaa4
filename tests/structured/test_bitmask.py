"""apply_token_bitmask against the token-by-token reference, and its place in the Sampler."""

from __future__ import annotations

import pytest
import torch

from ladle.sample.metadata import build_sampling_metadata
from ladle.sample.sampler import Sampler
from ladle.sampling.params import SamplingParams
from ladle.structured.bitmask import (
    apply_token_bitmask,
    bitmask_width,
    reference_apply_token_bitmask,
)
from ladle.structured.manager import GrammarBitmask


def _random_bitmask(num_rows: int, vocab_size: int, generator: torch.Generator) -> torch.Tensor:
    bits = torch.rand(num_rows, bitmask_width(vocab_size) * 32, generator=generator) < 0.3
    weights = (1 << torch.arange(32, dtype=torch.int64))
    words = (bits.view(num_rows, -1, 32).long() * weights).sum(-1)
    return (words - (words >= 2**31).long() * 2**32).to(torch.int32)  # as signed int32


@pytest.mark.parametrize("vocab_size", [1, 7, 31, 32, 33, 100, 1025])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference_on_awkward_sizes(vocab_size, dtype):
    generator = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(6, vocab_size, generator=generator).to(dtype)
    rows = torch.tensor([4, 0, 3], dtype=torch.int32)
    bitmask = _random_bitmask(3, vocab_size, generator)
    expected = reference_apply_token_bitmask(logits, bitmask, rows)
    apply_token_bitmask(logits, bitmask, rows)
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)
    untouched = [1, 2, 5]
    assert torch.isfinite(logits[untouched]).all()


def test_all_ones_and_all_zeros_words():
    logits = torch.zeros(2, 64)
    bitmask = torch.tensor([[-1, 0], [0, -1]], dtype=torch.int32)  # -1: all 32 bits set
    apply_token_bitmask(logits, bitmask, torch.tensor([0, 1]))
    assert torch.isfinite(logits[0, :32]).all() and torch.isinf(logits[0, 32:]).all()
    assert torch.isinf(logits[1, :32]).all() and torch.isfinite(logits[1, 32:]).all()


def test_packed_views_as_the_manager_builds_them():
    """Masks then row indices in one buffer: the views are strided, the result the same."""
    generator = torch.Generator().manual_seed(0)
    vocab_size, width = 70, bitmask_width(70)
    logits = torch.randn(5, vocab_size, generator=generator)
    masks = _random_bitmask(2, vocab_size, generator)
    packed = torch.cat([masks.flatten(), torch.tensor([3, 1], dtype=torch.int32)])
    expected = reference_apply_token_bitmask(logits, masks, torch.tensor([3, 1]))
    apply_token_bitmask(logits, packed[: 2 * width].view(2, width), packed[2 * width :])
    torch.testing.assert_close(logits, expected, rtol=0, atol=0)


def test_a_too_narrow_bitmask_is_an_error():
    with pytest.raises(ValueError, match="too few"):
        apply_token_bitmask(torch.zeros(1, 65), torch.zeros(1, 2, dtype=torch.int32),
                            torch.tensor([0]))


def test_sampler_masks_choices_but_reports_the_models_logprobs():
    generator = torch.Generator().manual_seed(1)
    vocab_size = 50
    logits = torch.randn(3, vocab_size, generator=generator)
    allowed = [5, 17]  # row 1 may only pick these
    bits = torch.zeros(1, bitmask_width(vocab_size) * 32, dtype=torch.bool)
    bits[0, allowed] = True
    words = (bits.view(1, -1, 32).long() << torch.arange(32)).sum(-1)
    bitmask = (words - (words >= 2**31).long() * 2**32).to(torch.int32)
    params = [SamplingParams(temperature=0, logprobs=3)] * 2 + [
        SamplingParams(temperature=1.0, seed=5, logprobs=3)
    ]
    metadata = build_sampling_metadata(
        params, [0, 1, 2], [0, 0, 0], vocab_size=vocab_size, device=torch.device("cpu")
    )
    grammar = GrammarBitmask(bitmask=bitmask, row_indices=torch.tensor([1], dtype=torch.int32))
    plain = Sampler()(logits.clone(), metadata)
    constrained = Sampler()(logits.clone(), metadata, grammar)
    expected_row1 = allowed[int(logits[1, allowed].argmax())]
    assert constrained.sampled_token_ids[1].item() == expected_row1
    # Unconstrained rows sample exactly as without a grammar in the batch.
    assert constrained.sampled_token_ids[0] == plain.sampled_token_ids[0]
    assert constrained.sampled_token_ids[2] == plain.sampled_token_ids[2]
    # Logprobs come from the raw distribution, for the constrained row too.
    raw = torch.log_softmax(logits, dim=-1)
    torch.testing.assert_close(constrained.logprobs[:, 0], raw[torch.arange(3),
                                                               constrained.sampled_token_ids])
    torch.testing.assert_close(constrained.logprob_token_ids[:, 1:], plain.logprob_token_ids[:, 1:])
