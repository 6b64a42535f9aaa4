"""The small per-layer ops of a CPU decode step through the C kernels: RMSNorm with its residual
add, SiLU-and-multiply, and decode attention read in place from the paged cache.

At batch 1 each torch version is several ops of a few microseconds of dispatch each, and a
decode step of the default model runs ~600 of them; one C call replaces each group. Every
function returns None when its kernel does not apply (no library, not float32 on the CPU, a
layout it does not take) and the caller runs its torch code, which is the reference.
"""

from __future__ import annotations

import torch

from ladle.kernels.cpu_native.build import kernel_threads, native_library

# The norm and activation kernels run on one thread: past a batch (prefill chunks) torch's
# multi-threaded ops win (a 232-token prefill measured 1007 ms against 726 with them in C
# everywhere, when SiLU's exp was still scalar), so they take batch-sized inputs only. At batch
# 32 each C call beat torch's ops (t12c2, [32, 576] norm: 0.95 against 2.0 ms per 60 calls).
MAX_ELEMENTWISE_ROWS = 64


def _is_cpu_float32(*tensors: torch.Tensor) -> bool:
    return all(
        t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous() for t in tensors
    )


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None:
    """RMSNorm(x) * weight, or with a residual: residual += x in place, then (RMSNorm(residual)
    * weight, residual). None when the kernel does not apply."""
    library = native_library()
    if library is None or x.requires_grad or not _is_cpu_float32(x, weight):
        return None
    hidden = weight.shape[0]
    if x.shape[-1] != hidden or x.numel() == 0:
        return None
    num_rows = x.numel() // hidden
    if num_rows > MAX_ELEMENTWISE_ROWS:
        return None
    output = torch.empty_like(x)
    if residual is None:
        # Normalising x itself: the kernel's "residual" is x, read only (no add).
        library.ladle_add_rms_norm(
            None, x.data_ptr(), weight.data_ptr(), eps, output.data_ptr(), num_rows, hidden
        )
        return output
    if residual.shape != x.shape or not _is_cpu_float32(residual):
        return None
    library.ladle_add_rms_norm(
        x.data_ptr(), residual.data_ptr(), weight.data_ptr(), eps, output.data_ptr(), num_rows,
        hidden,
    )  # fmt: skip
    return output, residual


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor | None:
    """silu(gate) * up for gate_up [..., 2 d]; None when the kernel does not apply."""
    library = native_library()
    if library is None or gate_up.requires_grad or not _is_cpu_float32(gate_up):
        return None
    width = gate_up.shape[-1] // 2
    if width == 0 or gate_up.shape[-1] % 2 or gate_up.numel() > MAX_ELEMENTWISE_ROWS * 2 * width:
        return None
    output = gate_up.new_empty(*gate_up.shape[:-1], width)
    library.ladle_silu_and_mul(
        gate_up.data_ptr(), output.data_ptr(), gate_up.numel() // (2 * width), width
    )
    return output


def paged_decode_attention(
    query: torch.Tensor,  # [num_requests, num_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slots: torch.Tensor,  # int64 [num_requests * max_context]
    lengths: torch.Tensor,  # int64 [num_requests]
    max_context: int,
    scale: float,
) -> torch.Tensor | None:
    """Each query row attends over its request's first lengths[r] cache slots; None when the
    kernel does not apply (a float8 cache, head_dim > 256, other dtypes)."""
    library = native_library()
    if library is None or not _is_cpu_float32(query, kv_cache):
        return None
    if slots.dtype != torch.int64 or lengths.dtype != torch.int64 or not slots.is_contiguous():
        return None
    num_requests, num_heads, head_dim = query.shape
    num_kv_heads = kv_cache.shape[3]
    lengths = lengths.contiguous()  # held here: the kernel reads it through a bare pointer
    output = torch.empty_like(query)
    status = library.ladle_decode_attention(
        query.data_ptr(), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(), slots.data_ptr(),
        lengths.data_ptr(), num_requests, max_context, num_heads, num_kv_heads,
        head_dim, scale, output.data_ptr(), kernel_threads(),
    )  # fmt: skip
    return output if status == 0 else None


def rotate_and_cache(
    qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim], rotated in place
    rotary_tables: tuple[torch.Tensor, torch.Tensor],  # RotaryEmbedding.step_tables
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens]
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> bool:
    """Rotary on qkv's query and key heads in place, and its keys and values written to their
    cache slots (`rotate_with_tables` then `write_kv_cache`, same values); False, with nothing
    done, when the kernel does not apply (a float8 cache, other dtypes or layouts)."""
    library = native_library()
    cos, signed_sin = rotary_tables
    if library is None or qkv.requires_grad or not _is_cpu_float32(qkv, kv_cache, cos, signed_sin):
        return False
    num_tokens = qkv.shape[0]
    if qkv.dim() != 2 or qkv.shape[1] != (num_heads + 2 * num_kv_heads) * head_dim:
        return False
    if cos.numel() != num_tokens * head_dim or signed_sin.numel() != cos.numel():
        return False
    if slot_mapping.dtype != torch.int64 or not slot_mapping.is_contiguous():
        return False
    if kv_cache.shape[3:] != (num_kv_heads, head_dim):
        return False
    status = library.ladle_rotary_and_cache(
        qkv.data_ptr(), num_tokens, qkv.shape[1], num_heads, num_kv_heads, head_dim,
        cos.data_ptr(), signed_sin.data_ptr(), kv_cache[0].data_ptr(), kv_cache[1].data_ptr(),
        slot_mapping.data_ptr(), kv_cache.shape[1] * kv_cache.shape[2],
    )  # fmt: skip
    return status == 0
