"""The symmetric-memory all-reduces' start-up choice and its place in TensorParallel (CPU side; the
kernels themselves run on 2 and 4 GPUs: tests/gpu/test_tensor_parallel_gpu.py and
scripts/tp_round.sh)."""

from __future__ import annotations

import dataclasses

import torch

from ladle.distributed.fast_all_reduce import (
    NCCL,
    ONE_SHOT,
    PROBE_BYTES,
    TWO_SHOT,
    SymmetricMemoryAllReduce,
    describe,
    fastest_methods,
    with_fast_all_reduce,
)
from ladle.distributed.tensor_parallel import TensorParallel


def test_each_size_takes_its_fastest_method_and_nccl_wins_ties():
    timings = {
        NCCL: [16, 17, 18, 24, 46, 80],
        ONE_SHOT: [7, 9, 11, 19, 60, 120],
        TWO_SHOT: [12, 13, 14, 19, 21, 80],
    }
    methods = fastest_methods(timings)
    # 1 MiB: one-shot and two-shot tie, the first listed of the two wins; 8 MiB: a tie with
    # NCCL keeps NCCL.
    assert methods == (ONE_SHOT, ONE_SHOT, ONE_SHOT, ONE_SHOT, TWO_SHOT, NCCL)
    assert describe(PROBE_BYTES, methods) == (
        "one-shot up to 1024 KiB, two-shot up to 4096 KiB, NCCL above"
    )


def test_a_message_goes_to_the_method_of_the_smallest_probe_size_that_holds_it():
    buffer = torch.empty(16)
    fast = SymmetricMemoryAllReduce(
        buffer, "g", sizes=(16, 64, 256), methods=(ONE_SHOT, NCCL, TWO_SHOT)
    )
    assert [fast.method_for(n) for n in (1, 16, 17, 64, 65, 256, 257)] == [
        ONE_SHOT, ONE_SHOT, NCCL, NCCL, TWO_SHOT, TWO_SHOT, NCCL
    ]
    # takes() also asks for the buffer's dtype, a contiguous tensor and whole 16-byte granules.
    assert fast.takes(torch.empty(4)) and fast.takes(torch.empty(64))
    assert not fast.takes(torch.empty(10))  # 40 bytes: NCCL's table entry
    assert not fast.takes(torch.empty(2))  # 8 bytes: not a granule
    assert not fast.takes(torch.empty(4, dtype=torch.float64))
    assert not fast.takes(torch.empty(2, 2).t())


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
