"""CacheConfig: the paged KV cache (blocks, dtype, prefix caching, the host tier, KV transfer)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ladle.kv_transfer.config import KVTransferConfig

# "auto": the model's dtype. fp8 and fp8_e4m3 are one format (vLLM's spellings).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")


@dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache.

    On CUDA the pool is sized from free memory after a measured peak forward pass, times
    gpu_memory_utilization. On the CPU it is cpu_kv_cache_gib. num_kv_blocks overrides both
    (tests use it to force preemption).
    """

    block_size: int = field(default=16, metadata={"help": "tokens per KV cache block"})
    gpu_memory_utilization: float = field(
        default=0.90, metadata={"help": "fraction of GPU memory for weights, activations and KV"}
    )
    cpu_kv_cache_gib: float = field(
        default=1.0, metadata={"help": "KV cache size on the CPU, in GiB"}
    )
    num_kv_blocks: int | None = field(
        default=None, metadata={"help": "KV cache blocks, overriding the measured size"}
    )
    enable_prefix_caching: bool = field(
        default=True, metadata={"help": "reuse the KV cache of shared prompt prefixes"}
    )
    kv_offloading_size: float | None = field(
        default=None,
        metadata={"help": "GiB of host memory for the KV cache's host tier: full prefix blocks "
                  "are written back there and loaded again when a later prompt needs them "
                  "(0 turns it off; default: on CUDA a share of the free host memory, capped "
                  "at 4 GiB; off on the CPU, whose KV is in host memory already)"},
    )
    kv_cache_dtype: str = field(
        default="auto",
        metadata={"help": "KV cache storage: auto (the model's dtype) or fp8 / fp8_e4m3 (float8 "
                  "e4m3 with per-layer k/v scales from the checkpoint or a start-up "
                  "calibration: about twice the tokens of bf16)"},
    )
    kv_transfer_config: dict | None = field(
        default=None,
        metadata={"help": "prefill/decode disaggregation, as JSON (vLLM's keys): "
                  '\'{"kv_role": "kv_producer"|"kv_consumer"|"kv_both", "kv_connector": '
                  '"LadleConnector"}\' (docs/serving.md; `ladle serve --disaggregate 1P1D` sets '
                  "it up on one machine)"},
    )

    def __post_init__(self) -> None:
        if self.kv_transfer_config is not None:
            self.kv_transfer  # noqa: B018 -- validates now, at start-up
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            is_e5m2 = self.kv_cache_dtype == "fp8_e5m2"
            hint = "; e5m2 is not supported, use fp8_e4m3" if is_e5m2 else ""
            raise ValueError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of "
                f"{', '.join(KV_CACHE_DTYPES)}{hint}"
            )
        if self.block_size < 1 or self.block_size > 1024:
            raise ValueError(f"block_size must be in [1, 1024], got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.cpu_kv_cache_gib <= 0:
            raise ValueError(f"cpu_kv_cache_gib must be > 0, got {self.cpu_kv_cache_gib}")
        if self.kv_offloading_size is not None and not self.kv_offloading_size >= 0:
            raise ValueError(
                f"kv_offloading_size must be >= 0 GiB (0 turns the host tier off), got "
                f"{self.kv_offloading_size}"
            )
        # Block 0 is the reserved null block, so a usable pool needs at least two.
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2, got {self.num_kv_blocks}")

    @property
    def kv_transfer(self) -> KVTransferConfig | None:
        """The parsed kv_transfer_config; None for an engine that is not disaggregated."""
        if self.kv_transfer_config is None:
            return None
        return KVTransferConfig.from_dict(self.kv_transfer_config)
