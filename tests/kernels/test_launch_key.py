"""kernels/launch.py's specialisation key: it must tell apart every pair of launches that
Triton would compile differently (else the fast path would run a kernel built for other values),
and it may be finer. Checked on the CPU with a kernel's parameter list alone (no Triton needed)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import torch

from ladle.kernels.launch import _KernelLaunches


def _param(name: str, constexpr: bool = False, default=inspect.Parameter.empty):
    return SimpleNamespace(
        name=name,
        is_constexpr=constexpr,
        default=default,
        has_default=default is not inspect.Parameter.empty,
    )


def _launches() -> _KernelLaunches:
    kernel = SimpleNamespace(
        __name__="kernel",
        params=[
            _param("x_ptr"),
            _param("n"),
            _param("scale"),
            _param("BLOCK", constexpr=True),
            _param("FLAG", constexpr=True, default=False),
        ],
    )
    return _KernelLaunches(kernel)


def _key(args, **kwargs):
    return _launches().key(0, args, kwargs)


def test_constexprs_and_options_count_by_value():
    x = torch.zeros(64)
    # BLOCK 64 and 128 are both divisible by 16: a runtime int's class would merge them.
    assert _key((x, 5, 1.0, 64)) != _key((x, 5, 1.0, 128))
    assert _key((x, 5, 1.0), BLOCK=64) != _key((x, 5, 1.0), BLOCK=128)
    assert _key((x, 5, 1.0, 64), num_warps=4) != _key((x, 5, 1.0, 64), num_warps=8)
    assert _key((x, 5, 1.0, 64), FLAG=True) != _key((x, 5, 1.0, 64), FLAG=False)


def test_runtime_ints_count_by_what_triton_specialises():
    x = torch.zeros(64)
    assert _key((x, 5, 1.0, 64)) == _key((x, 7, 1.0, 64))  # one compiled kernel for both
    assert _key((x, 1, 1.0, 64)) != _key((x, 5, 1.0, 64))  # == 1 becomes a constant
    assert _key((x, 32, 1.0, 64)) != _key((x, 5, 1.0, 64))  # divisible by 16
    assert _key((x, 3, 1.0, 64)) != _key((x, 2**40 + 3, 1.0, 64))  # i32 against i64
    assert _key((x, 5, 1.0, 64)) != _key((x, 5, 2, 64))  # a float against an int
    assert _key((x, 5, 1.0), n=5, BLOCK=64) != _key((x, 5, 1.0), n=16, BLOCK=64)


def test_tensors_count_by_dtype_and_alignment():
    x = torch.zeros(64)
    assert _key((x, 5, 1.0, 64)) == _key((torch.ones(64), 5, 1.0, 64))
    assert _key((x, 5, 1.0, 64)) != _key((x.half(), 5, 1.0, 64))
    assert x.data_ptr() % 16 == 0
    assert _key((x, 5, 1.0, 64)) != _key((x[1:], 5, 1.0, 64))  # 4 bytes past an aligned start


def test_bound_values_follow_the_kernel_order_with_defaults():
    launches = _launches()
    x = torch.zeros(4)
    assert launches.bound_values((x,), {"scale": 2.0, "n": 3, "BLOCK": 16}) == [
        x, 3, 2.0, 16, False,
    ]


def test_a_launch_hook_counts_as_set_only_when_one_is_installed():
    from ladle.kernels.launch import _hooked

    def hook(metadata):
        return None

    # Triton 3.6: chains, empty when no profiler installed one; earlier versions: None.
    assert not _hooked(SimpleNamespace(calls=[]))
    assert _hooked(SimpleNamespace(calls=[hook]))
    assert not _hooked(None)
    assert _hooked(hook)
