"""kernels/launch.py on the GPU: launches through the fast path give what Triton's own launch
gives (a torch reference), across the values Triton specialises on, and after the first launch
of a specialisation they do not go through Triton's launch path."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _scaled_copy_kernel(out_ptr, x_ptr, n, stride, scale, BLOCK: tl.constexpr, ADD: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    values = tl.load(x_ptr + offsets * stride, mask=mask)
    result = values * scale
    if ADD:
        result += n
    tl.store(out_ptr + offsets, result, mask=mask)


def _reference(x, n, stride, scale, add):
    result = x[: n * stride : stride][:n] * scale
    return result + n if add else result


def test_fast_launches_match_the_reference_across_specialisations(monkeypatch):
    from triton.runtime.jit import JITFunction

    from ladle.kernels.launch import launch

    through_triton = []
    original = JITFunction.run

    def counted(fn, *args, **kwargs):
        through_triton.append(fn)
        return original(fn, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "run", counted)
    base = torch.randn(4096, device="cuda")
    cases = [  # (offset into base: alignment, n: 1 / %16 / other, stride 1 or 2, BLOCK, ADD)
        (0, 1000, 1, 256, False),
        (1, 1000, 1, 256, False),  # misaligned pointer
        (0, 1, 1, 256, False),  # n == 1
        (0, 1024, 1, 256, True),  # n divisible by 16
        (3, 777, 2, 128, True),
        (0, 1000, 1, 512, False),  # another BLOCK
    ]
    for repeat in range(3):
        for offset, n, stride, block, add in cases:
            x = base[offset:]
            out = torch.full((n,), float("nan"), device="cuda")
            scale = 0.5 + repeat
            launch(
                _scaled_copy_kernel, (triton.cdiv(n, block),), out, x, n, stride, scale,
                BLOCK=block, ADD=add,
            )  # fmt: skip
            torch.testing.assert_close(out, _reference(x, n, stride, scale, add))
        if repeat == 0:
            first_round = len(through_triton)
    assert first_round == len(cases)
    assert len(through_triton) == first_round  # later rounds: the compiled kernels directly


def test_fast_launch_is_captured_by_a_cuda_graph():
    from ladle.kernels.launch import launch

    x = torch.randn(300, device="cuda")
    out = torch.zeros(300, device="cuda")
    args = (out, x, 300, 1, 2.0)
    launch(_scaled_copy_kernel, (2,), *args, BLOCK=256, ADD=False)  # compiled outside capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        launch(_scaled_copy_kernel, (2,), *args, BLOCK=256, ADD=False)
    torch.cuda.current_stream().wait_stream(stream)
    out.zero_()
    x.copy_(torch.randn(300, device="cuda"))
    graph.replay()
    torch.testing.assert_close(out, x * 2.0)
