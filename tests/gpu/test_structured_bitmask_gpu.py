"""The Triton bitmask kernel on CUDA against the torch path (itself tested against the
token-by-token reference on the CPU), at real vocabulary sizes and dtypes."""

from __future__ import annotations

import pytest
import torch

from ladle.structured.bitmask import _apply_token_bitmask_torch, bitmask_width

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("vocab_size", [1, 33, 4097, 49152, 128256, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_triton_kernel_matches_torch(vocab_size, dtype):
    from ladle.structured.bitmask import apply_token_bitmask

    generator = torch.Generator().manual_seed(vocab_size)
    logits = torch.randn(64, vocab_size, generator=generator).to(dtype)
    rows = torch.randperm(64, generator=generator)[:16].to(torch.int32)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (16, bitmask_width(vocab_size)),
                            generator=generator, dtype=torch.int64).to(torch.int32)
    expected = logits.clone()
    _apply_token_bitmask_torch(expected, bitmask, rows)
    on_device = logits.cuda()
    apply_token_bitmask(on_device, bitmask.cuda(), rows.cuda())
    torch.testing.assert_close(on_device.cpu(), expected, rtol=0, atol=0)


def test_packed_strided_views_on_cuda():
    from ladle.structured.bitmask import apply_token_bitmask

    vocab_size, width = 1000, bitmask_width(1000)
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, vocab_size, generator=generator)
    masks = torch.randint(-(2**31), 2**31 - 1, (3, width), generator=generator,
                          dtype=torch.int64).to(torch.int32)
    rows = torch.tensor([7, 0, 4], dtype=torch.int32)
    expected = logits.clone()
    _apply_token_bitmask_torch(expected, masks, rows)
    packed = torch.cat([masks.flatten(), rows]).cuda()
    on_device = logits.cuda()
    apply_token_bitmask(on_device, packed[: 3 * width].view(3, width), packed[3 * width :])
    torch.testing.assert_close(on_device.cpu(), expected, rtol=0, atol=0)
