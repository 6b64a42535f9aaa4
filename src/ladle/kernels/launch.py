"""Launching a Triton kernel with less host work than `kernel[grid](...)`, for the kernels an
engine step launches outside CUDA graphs (sampling, drafting, graph inputs).

Triton's launch path binds the arguments, specialises each one (dtype, 16-byte alignment,
integers equal to 1 or divisible by 16), builds a cache key from them and the compile options,
reads its knobs and then calls the compiled kernel's launcher. On the H200 host that came to
about a quarter of a batch-1 step's host time under cProfile (5.8 launches a drafted step,
`scripts/step_host_ops.py --python-profile`). Here the first launch of each distinct
specialisation goes through Triton (which compiles it), and later ones call the compiled kernel's
launcher directly, found by a key computed in a few Python operations an argument.

The key is at least as fine as Triton's own specialisation: for a tensor its dtype and whether
its address is 16-byte aligned; for an int whether it is 1, whether it is divisible by 16 and
its width class; every other value itself (constexprs, options). Two launches with one key
therefore share one compiled kernel in Triton too. Where the fast path cannot be used (Triton's
interpreter, a launch hook set by a profiler, a value that cannot be hashed) the launch goes
through Triton as usual.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

_INT32_MIN, _INT32_END, _INT64_END = -(2**31), 2**31, 2**63


class _KernelLaunches:
    """One kernel's compiled specialisations and which of its arguments count by value."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel
        self.params = kernel.params
        # Constexprs select code by their value; so do options (num_warps, ...), which are
        # keyword arguments that name no parameter.
        self.by_value_positions = tuple(param.is_constexpr for param in self.params)
        self.runtime_names = frozenset(p.name for p in self.params if not p.is_constexpr)
        self.compiled: dict[tuple, Any] = {}

    def key(self, device: int, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple:
        by_value = self.by_value_positions
        return (
            device,
            tuple(
                value if by_value[index] else _runtime_key(value)
                for index, value in enumerate(args)
            ),
            tuple(
                (name, _runtime_key(value) if name in self.runtime_names else value)
                for name, value in kwargs.items()
            ),
        )

    def bound_values(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
        """Every parameter's value in the kernel's order (what its launcher takes)."""
        values = list(args)
        for param in self.params[len(args) :]:
            if param.name in kwargs:
                values.append(kwargs[param.name])
            elif param.has_default:
                values.append(param.default)
            else:
                raise TypeError(f"{self.kernel.__name__}: missing argument {param.name!r}")
        return values


def _runtime_key(value: Any) -> Any:
    """What Triton specialises a runtime argument on, or finer."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() & 15 == 0
    if type(value) is int:
        return (
            value == 1,
            value & 15 == 0,
            _INT32_MIN <= value < _INT32_END,
            value < _INT64_END,
        )
    if type(value) is float:
        return float
    return value


# kernel (a JITFunction) -> its launches; None: always Triton's path.
_kernels: dict[Any, _KernelLaunches | None] = {}


def _launches_of(kernel) -> _KernelLaunches | None:
    launches = _kernels.get(kernel, False)
    if launches is False:
        from triton.runtime.jit import JITFunction

        # The interpreter's kernels are not JITFunctions, and an autotuner picks per launch.
        launches = _KernelLaunches(kernel) if type(kernel) is JITFunction else None
        _kernels[kernel] = launches
    return launches


def _hooked(hook) -> bool:
    """Whether a launch hook is set: Triton 3.6's are chains, empty when none is; earlier
    versions' are None then."""
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else hook is not None


def launch(kernel, grid: Sequence[int], *args: Any, **kwargs: Any) -> None:
    """kernel[grid](*args, **kwargs), on the current CUDA device and stream."""
    launches = _launches_of(kernel)
    if launches is None:
        kernel[grid](*args, **kwargs)
        return
    from triton import knobs

    device = torch._C._cuda_getDevice()
    try:
        key = launches.key(device, args, kwargs)
        compiled = launches.compiled.get(key)
    except TypeError:  # an unhashable value: let Triton specialise it
        kernel[grid](*args, **kwargs)
        return
    runtime = knobs.runtime
    if (
        compiled is None
        or _hooked(runtime.launch_enter_hook)
        or _hooked(runtime.launch_exit_hook)
    ):
        compiled = kernel[grid](*args, **kwargs)
        if hasattr(compiled, "result"):  # asynchronous compilation's future
            compiled = compiled.result()
        launches.compiled[key] = compiled
        return
    compiled.run(
        grid[0],
        grid[1] if len(grid) > 1 else 1,
        grid[2] if len(grid) > 2 else 1,
        torch._C._cuda_getCurrentRawStream(device),
        compiled.function,
        compiled.packed_metadata,
        None,  # launch metadata: only a launch hook reads it
        None,  # no launch hooks (a profiler's would have taken Triton's path above)
        None,
        *launches.bound_values(args, kwargs),
    )
