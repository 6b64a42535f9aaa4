"""Would a head-major KV cache block ([2, blocks, kv_heads, block_size, head_dim], FlashInfer's
HND) make decode attention faster than ladle's token-major one ([2, blocks, block_size, kv_heads,
head_dim], NHD)? With NHD one (request, kv head) program reads 128-byte (fp8) or 256-byte (bf16)
rows 1 KiB / 2 KiB apart; with HND a block's rows of one head are one contiguous run. The kernel
takes the cache's strides, so the same kernel reads both (the HND copy passed as a permuted
view). 8B heads, W2's shapes, ms per call in a CUDA graph; the outputs must agree exactly.

    python scripts/kv_layout_probe.py
"""

from __future__ import annotations

import functools
import json

import torch

from ladle.attention.kv_quant import quantize_kv
from ladle.bench.attention_bench import Shape, build, time_in_graph
from ladle.kernels.paged_attention import LaunchConfig, _launch

SHAPES = ((256, 1024), (256, 512), (128, 768), (64, 1024), (8, 4096))


def head_major_view(cache: torch.Tensor) -> torch.Tensor:
    """The same values stored head-major, viewed in the token-major index order."""
    return cache.permute(0, 1, 3, 2, 4).contiguous().permute(0, 1, 3, 2, 4)


def main() -> None:
    for num_reqs, seq_len in SHAPES:
        shape = Shape("decode", num_reqs, 1, seq_len, num_heads=32, num_kv_heads=8)
        query, kv_cache, block_tables, query_start_loc, seq_lens = build(shape)
        scales = torch.tensor([0.01], device="cuda"), torch.tensor([0.01], device="cuda")
        fp8_cache = quantize_kv(kv_cache, scales[0])
        for label, cache, kv_scales in (("bf16", kv_cache, None), ("fp8", fp8_cache, scales)):
            configs = [LaunchConfig()]
            for block_n in (16, 32, 64, 128):
                for num_warps in (1, 2, 4):
                    configs.append(LaunchConfig(block_n=block_n, num_warps=num_warps))
            reference = None
            for layout, view in (("NHD", cache), ("HND", head_major_view(cache))):
                for config in configs:
                    output = torch.empty_like(query)
                    run = functools.partial(
                        _launch,
                        query,
                        view,
                        block_tables,
                        query_start_loc,
                        seq_lens,
                        1,
                        0.088,
                        output,
                        config,
                        kv_scales,
                    )
                    try:
                        ms = time_in_graph(run, 10, 60)
                    except Exception as error:  # noqa: BLE001 (a config that fails is a row)
                        print(json.dumps({"case": str(config), "error": str(error)[:120]}))
                        continue
                    if config == LaunchConfig():
                        if reference is None:
                            reference = output.clone()
                        same = bool(torch.equal(output, reference))
                    else:
                        same = None
                    cache_bytes = cache.element_size() * 2 * num_reqs * seq_len * 8 * 128
                    print(
                        json.dumps(
                            {
                                "num_reqs": num_reqs,
                                "seq_len": seq_len,
                                "cache": label,
                                "layout": layout,
                                "block_n": config.block_n,
                                "warps": config.num_warps,
                                "ms": round(ms, 4),
                                "cache_gb_per_s": round(cache_bytes / ms / 1e6, 1),
                                "same_as_nhd_default": same,
                            }
                        ),
                        flush=True,
                    )


if __name__ == "__main__":
    main()
