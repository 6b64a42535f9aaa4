"""The small-message all-reduce's start-up choice and its place in TensorParallel (CPU side; the
one-shot kernel itself runs on 2 GPUs: tests/gpu/test_tensor_parallel_gpu.py and
scripts/tp_round.sh)."""

from __future__ import annotations

import dataclasses

import torch

from ladle.distributed.fast_all_reduce import size_limit, with_fast_all_reduce
from ladle.distributed.tensor_parallel import TensorParallel


def test_the_limit_is_the_unbroken_run_of_faster_sizes_from_the_smallest():
    sizes = (8, 64, 256, 1024)
    assert size_limit(sizes, [18, 19, 22, 40], [6, 7, 15, 60]) == 256
    assert size_limit(sizes, [18, 19, 22, 40], [6, 7, 15, 30]) == 1024
    # A loss breaks the run: a faster size past it is not trusted.
    assert size_limit(sizes, [18, 19, 22, 40], [6, 25, 15, 30]) == 8
    assert size_limit(sizes, [18, 19, 22, 40], [20, 7, 15, 30]) == 0


class _Doubling:
    """A stand-in fast path that takes tensors of up to 4 elements (and 'sums' two ranks)."""

    def __init__(self) -> None:
        self.calls = 0

    def takes(self, tensor: torch.Tensor) -> bool:
        return tensor.numel() <= 4

    def __call__(self, partial: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return partial.mul_(2)


def test_tensor_parallel_sends_the_tensors_the_fast_path_takes_to_it():
    fast = _Doubling()
    tp = TensorParallel(rank=0, size=2, group=None, fast_all_reduce=fast)
    small = torch.ones(4)
    assert torch.equal(tp.all_reduce(small), torch.full((4,), 2.0)) and fast.calls == 1
    # One rank never reduces, fast path or not.
    single = dataclasses.replace(tp, size=1)
    assert torch.equal(single.all_reduce(torch.ones(2)), torch.ones(2)) and fast.calls == 1


def test_no_fast_path_off_cuda_or_when_disabled():
    tp = TensorParallel(rank=0, size=2, group=None)
    assert with_fast_all_reduce(tp, torch.device("cpu"), torch.float32) is tp
    assert with_fast_all_reduce(tp, torch.device("cuda"), torch.bfloat16, disabled=True) is tp
    one = TensorParallel()
    assert with_fast_all_reduce(one, torch.device("cuda"), torch.bfloat16) is one


def test_peers_must_share_a_host_and_reach_each_other():
    from ladle.distributed.fast_all_reduce import peers_reachable

    def always(mine: int, theirs: int) -> bool:
        return True

    def never(mine: int, theirs: int) -> bool:
        return False

    assert peers_reachable([("a", 0), ("a", 1)], 0, always)
    assert not peers_reachable([("a", 0), ("a", 1)], 0, never)  # PCIe without P2P
    assert not peers_reachable([("a", 0), ("b", 0)], 0, always)  # two hosts
    assert peers_reachable([("a", 3)], 3, never)  # only itself
