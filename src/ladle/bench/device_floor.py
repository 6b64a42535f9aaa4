"""The hardware floor of a workload, from two ceilings measured on the device at start.

- copy bandwidth: a large device-to-device copy, bytes read + bytes written over its time;
- matmul rate: a large square matrix product in the model's dtype.

A workload's floor time is the larger of its arithmetic over the matmul rate (2 x parameters per
token, prompt and generated) and its bytes over the bandwidth (the weights read once per step, the
KV cache read once per generated token). Measured time over the floor time says how far from the
hardware the engine runs. On the CPU the same two ceilings are measured, at a smaller size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DeviceCeilings:
    copy_bytes_per_s: float
    matmul_flops_per_s: float


def _timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of fn over repeats, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    times.sort()
    return times[len(times) // 2]


def measure_ceilings(device: torch.device, dtype: torch.dtype) -> DeviceCeilings:
    on_gpu = device.type == "cuda"
    numel = (256 if on_gpu else 16) * 1024 * 1024 // 4  # float32 elements
    source = torch.randn(numel, device=device)
    target = torch.empty_like(source)
    copy_s = _timed(lambda: target.copy_(source), device, 10 if on_gpu else 3)
    size = 8192 if on_gpu else 512
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    matmul_s = _timed(lambda: a @ b, device, 10 if on_gpu else 3)
    return DeviceCeilings(
        copy_bytes_per_s=2 * numel * 4 / copy_s, matmul_flops_per_s=2 * size**3 / matmul_s
    )


def floor_seconds(
    ceilings: DeviceCeilings,
    *,
    num_params: int,
    weights_bytes: int,
    kv_bytes_per_token: int,
    prompt_lens: list[int],
    output_lens: list[int],
    max_num_seqs: int,
) -> float:
    """The floor of a batch of requests (see the module docstring). Decode steps are counted as
    if every step ran max_num_seqs requests (fewer when fewer remain): the fewest steps that can
    produce the tokens, each reading the weights once."""
    num_tokens = sum(prompt_lens) + sum(output_lens)
    flops = 2 * num_params * num_tokens
    remaining = sorted(output_lens)
    num_steps = 0
    while remaining:  # a step advances the max_num_seqs longest-remaining requests
        batch = remaining[-max_num_seqs:]
        del remaining[-max_num_seqs:]
        shortest = batch[0]
        num_steps += shortest
        remaining = sorted(remaining + [n - shortest for n in batch if n > shortest])
    kv_read = sum(
        kv_bytes_per_token * (prompt * output + output * (output + 1) // 2)
        for prompt, output in zip(prompt_lens, output_lens)
    )
    bytes_moved = num_steps * weights_bytes + kv_read
    return max(flops / ceilings.matmul_flops_per_s, bytes_moved / ceilings.copy_bytes_per_s)
