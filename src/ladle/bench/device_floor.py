"""The hardware floor of a workload, from two ceilings measured on the device at start.

- copy bandwidth: a large device-to-device copy, bytes read + bytes written over its time;
- matmul rate: a large square matrix product in the model's dtype.

A workload's floor time is the larger of its arithmetic over the matmul rate (2 x parameters per
token, prompt and generated) and its bytes over the bandwidth (the weights read once per step, the
KV cache read once per generated token). Measured time over the floor time says how far from the
hardware the engine runs. On the CPU the same two ceilings are measured, at a smaller size.

A mixture of experts (ExpertWeights) changes both terms. Each token multiplies only its top_k
experts, so the arithmetic counts the active parameters (everything but the experts, plus
top_k / num_experts of them). A decode step of b tokens reads only the experts they chose: under
balanced routing (each token's experts uniform and independent) an expert escapes all b tokens
with probability (1 - top_k / num_experts) ** b, so the step reads the non-expert weights plus
that expected share of the experts: exactly the active weights at batch 1 (top_k of them) and
all experts once per step at large batches (Qwen3-30B-A3B: 8 of 128 at b = 1, 99% of them
from b = 72, 99.9% from b = 108).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ladle.model.weight_census import ExpertWeights, expert_weights  # noqa: F401 (re-exported)


def active_params(num_params: int, experts: ExpertWeights | None) -> float:
    """The parameters one token multiplies: all of a dense model's; a MoE model's non-expert
    parameters plus its top_k of num_experts experts."""
    if experts is None:
        return float(num_params)
    idle_share = 1 - experts.num_experts_per_token / experts.num_experts
    return num_params - experts.num_params * idle_share


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
    experts: ExpertWeights | None = None,
) -> float:
    """The floor of a batch of requests (see the module docstring). Decode steps are counted as
    if every step ran max_num_seqs requests (fewer when fewer remain): the fewest steps that can
    produce the tokens, each reading the weights once (a MoE model's: the non-expert weights and
    the share of the experts that step's tokens choose). num_params and weights_bytes are the
    whole model's, experts included."""
    num_tokens = sum(prompt_lens) + sum(output_lens)
    flops = 2 * active_params(num_params, experts) * num_tokens

    def step_bytes(batch_size: int) -> float:
        if experts is None:
            return weights_bytes
        return weights_bytes - experts.num_bytes * (1 - experts.share_read(batch_size))

    remaining = sorted(output_lens)
    weight_bytes_read = 0.0
    while remaining:  # a step advances the max_num_seqs longest-remaining requests
        batch = remaining[-max_num_seqs:]
        del remaining[-max_num_seqs:]
        shortest = batch[0]
        weight_bytes_read += shortest * step_bytes(len(batch))
        remaining = sorted(remaining + [n - shortest for n in batch if n > shortest])
    kv_read = sum(
        kv_bytes_per_token * (prompt * output + output * (output + 1) // 2)
        for prompt, output in zip(prompt_lens, output_lens)
    )
    bytes_moved = weight_bytes_read + kv_read
    return max(flops / ceilings.matmul_flops_per_s, bytes_moved / ceilings.copy_bytes_per_s)
