"""The float8 KV cache format: e4m3 codes with one float32 scale per layer for keys and one for
values (`--kv-cache-dtype fp8`).

A cached key is stored as fp8(clamp(key / k_scale, -448, 448)) and read back as code * k_scale,
so a scale of amax / 448 uses e4m3's whole range. Out-of-range values saturate at +-448 instead
of becoming NaN. These torch functions are the reference the Triton cache write and attention
kernels are tested against, and what the CPU backends run.
"""

from __future__ import annotations

import torch

FP8_KV_DTYPE = torch.float8_e4m3fn
FP8_E4M3_MAX = 448.0


def resolve_kv_cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """CacheConfig.kv_cache_dtype -> the torch dtype the cache tensors are allocated in."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return FP8_KV_DTYPE
    raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r} is not one of auto, fp8, fp8_e4m3")


def is_fp8_kv_cache(kv_cache: torch.Tensor) -> bool:
    return kv_cache.dtype == FP8_KV_DTYPE


def quantize_kv(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """values (any float dtype) -> e4m3 codes, values / scale saturated to e4m3's range."""
    scaled = values.float() / scale.float()
    return scaled.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_KV_DTYPE)


def dequantize_kv(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """e4m3 codes -> codes * scale in `dtype` (the model's compute dtype)."""
    return (codes.float() * scale.float()).to(dtype)


def check_kv_scale(name: str, scale: torch.Tensor) -> float:
    """A k/v scale from a checkpoint or a calibration as a float, or ValueError naming it: it
    must be one finite positive number (a per-tensor scale)."""
    if scale.numel() != 1:
        raise ValueError(
            f"KV cache scale {name!r} has shape {tuple(scale.shape)}; expected one number "
            "(a per-layer scale)"
        )
    value = float(scale.float().reshape(()))
    if not value > 0.0 or value == float("inf"):
        raise ValueError(f"KV cache scale {name!r} is {value}; it must be finite and > 0")
    return value
