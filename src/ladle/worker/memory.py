"""Size the KV cache from a memory budget and say where the memory goes.

CUDA: the pool gets what is left of gpu_memory_utilization x total memory after the weights, the
CUDA context and the peak of a measured worst-case forward pass (max_num_batched_tokens tokens).
CPU: a configured size (cpu_kv_cache_gib), since system memory is shared with everything else.

The host tier (kv_offloading_size GiB of host memory, pinned on CUDA) holds prefix blocks the
device pool wrote back: on CUDA it defaults to a share of the host memory free at start-up,
capped; on the CPU it is off unless asked for (the CPU's KV is in host memory already).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ladle.config import CacheConfig
from ladle.model.arch_config import ModelArchConfig

GIB = 1024**3
# The default host tier on CUDA: this share of the host memory available at start-up, at most
# the cap. Pinning costs start-up time (cudaHostAlloc maps and locks every page, of the order of
# a second per several GiB) on every engine start, and the host has other users: a larger tier
# is one flag away (--kv-offloading-size), and the multi-turn benchmark sets one.
DEFAULT_HOST_TIER_SHARE = 0.25
DEFAULT_HOST_TIER_CAP_GIB = 4.0


class InsufficientMemoryError(ValueError):
    """The model (or its activations) leaves no room for even a minimal KV cache."""


@dataclass(frozen=True)
class MemoryBudget:
    device: str
    weights_bytes: int
    activation_peak_bytes: int
    kv_cache_bytes: int
    block_bytes: int
    num_blocks: int  # including the reserved null block
    block_size: int
    graph_pool_bytes: int = 0  # CUDA graphs of decode steps, measured after capture
    kv_cache_dtype: torch.dtype | None = None  # what the cache is stored in
    num_host_blocks: int = 0  # the host tier's blocks (0: no host tier)
    copy_bytes_per_s: float = 0.0  # host <-> device copy bandwidth measured at start-up

    @property
    def num_host_token_slots(self) -> int:
        return self.num_host_blocks * self.block_size

    @property
    def num_token_slots(self) -> int:
        return (self.num_blocks - 1) * self.block_size

    def _dtype_note(self) -> str:
        return "" if self.kv_cache_dtype is None else f" in {str(self.kv_cache_dtype)[6:]}"

    def describe(self) -> str:
        return (
            f"memory budget on {self.device}: weights {self.weights_bytes / GIB:.3f} GiB, "
            f"activation peak {self.activation_peak_bytes / GIB:.3f} GiB, "
            f"CUDA graphs {self.graph_pool_bytes / GIB:.3f} GiB, "
            f"KV cache {self.kv_cache_bytes / GIB:.3f} GiB{self._dtype_note()} = "
            f"{self.num_blocks - 1} blocks of "
            f"{self.block_size} tokens ({self.block_bytes / 1024:.1f} KiB each), "
            f"{self.num_token_slots} tokens fit; {self._host_tier_note()}"
        )

    def _host_tier_note(self) -> str:
        if not self.num_host_blocks:
            return "host tier off"
        return (
            f"host tier {self.num_host_blocks * self.block_bytes / GIB:.3f} GiB = "
            f"{self.num_host_blocks} blocks, {self.num_host_token_slots} tokens "
            f"(copies {self.copy_bytes_per_s / 1e9:.1f} GB/s)"
        )


def kv_block_bytes(arch: ModelArchConfig, block_size: int, dtype: torch.dtype) -> int:
    dtype_bytes = torch.empty(0, dtype=dtype).element_size()
    return arch.kv_bytes_per_token(dtype_bytes) * block_size


def module_bytes(module: torch.nn.Module) -> int:
    tensors = list(module.parameters()) + list(module.buffers())
    # Quantized weights (packed for the CPU's int8 engine, or group-wise) are not buffers.
    quantized = [getattr(m, "quantized_weight", None) for m in module.modules()]
    quantized_bytes = sum(q.num_bytes for q in quantized if q is not None)
    return sum(t.numel() * t.element_size() for t in tensors) + quantized_bytes


def size_kv_cache(
    cache_config: CacheConfig,
    arch: ModelArchConfig,
    dtype: torch.dtype,
    device: torch.device,
    weights_bytes: int,
    run_peak_forward: Callable[[], None],
    run_graph_probe: Callable[[], None] | None = None,
    extra_kv_bytes_per_token: int = 0,
) -> MemoryBudget:
    """Decide how many KV blocks to allocate (run_peak_forward is only called on CUDA); dtype is
    the cache's (float8 e4m3 for kv_cache_dtype fp8: half of bf16's bytes per token).

    run_graph_probe, when graphs will be captured: a step of the largest graph batch, whose
    peak is reserved for the graph pool (graphs keep their activations in a pool of their own,
    which the eager steps cannot reuse)."""
    block_bytes = kv_block_bytes(arch, cache_config.block_size, dtype)
    # A draft network's pool (speculative decoding) has a block of its own per block id.
    block_bytes += extra_kv_bytes_per_token * cache_config.block_size
    activation_peak = 0
    if cache_config.num_kv_blocks is not None:
        num_blocks = cache_config.num_kv_blocks
    elif device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        allocated_before = torch.cuda.memory_allocated(device)
        run_peak_forward()
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        activation_peak = peak - allocated_before
        graph_reserve = 0
        if run_graph_probe is not None:
            torch.cuda.reset_peak_memory_stats(device)
            run_graph_probe()
            torch.cuda.synchronize(device)
            graph_reserve = torch.cuda.max_memory_allocated(device) - allocated_before
        torch.cuda.empty_cache()
        free_now, total = torch.cuda.mem_get_info(device)
        # Used now covers weights, the CUDA context and other processes; the activation peak
        # comes back at run time on top of it.
        used_now = total - free_now
        available = (
            total * cache_config.gpu_memory_utilization - used_now - activation_peak - graph_reserve
        )
        num_blocks = int(available // block_bytes)
    else:
        num_blocks = int(cache_config.cpu_kv_cache_gib * GIB // block_bytes)
    if num_blocks < 2:
        in_use = ""
        if device.type == "cuda":
            free_now, total = torch.cuda.mem_get_info(device)
            in_use = (
                f"; {(total - free_now) / GIB:.2f} of {total / GIB:.2f} GiB are in use on the "
                "device (this model, other engines in this process, other processes)"
            )
        raise InsufficientMemoryError(
            f"no room for the KV cache on {device}: weights take {weights_bytes / GIB:.2f} GiB "
            f"and the activation peak {activation_peak / GIB:.2f} GiB{in_use}; lower "
            "max_num_batched_tokens, raise gpu_memory_utilization, set num_kv_blocks, free "
            "other engines or use a smaller model"
        )
    return MemoryBudget(
        device=str(device),
        weights_bytes=weights_bytes,
        activation_peak_bytes=activation_peak,
        kv_cache_bytes=num_blocks * block_bytes,
        block_bytes=block_bytes,
        num_blocks=num_blocks,
        block_size=cache_config.block_size,
        kv_cache_dtype=dtype,
    )


def host_tier_bytes(cache_config: CacheConfig, device: torch.device) -> int:
    """Bytes of host memory for the KV cache's host tier (0: none)."""
    size_gib = cache_config.kv_offloading_size
    if size_gib is not None:
        return int(size_gib * GIB)
    if device.type != "cuda":
        return 0
    available = available_host_bytes()
    return int(min(DEFAULT_HOST_TIER_SHARE * available, DEFAULT_HOST_TIER_CAP_GIB * GIB))


def available_host_bytes() -> int:
    """Host memory available to new allocations (psutil's `available`; psutil is only a test
    dependency, so read /proc/meminfo where it is missing). 0 when neither can tell."""
    try:
        import psutil
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
