"""Decode attention over a bf16 vs a float8 paged cache on the 8B shape (32 heads, 8 kv heads,
head_dim 128): milliseconds per call in a CUDA graph and the effective bandwidth over the cache
bytes, for a few launch configs of the fp8 path (t12k's round; prints one JSON line per case)."""

from __future__ import annotations

import functools
import json

import torch

from ladle.attention.kv_quant import quantize_kv
from ladle.bench.attention_bench import Shape, build, time_in_graph
from ladle.kernels.paged_attention import LaunchConfig, paged_attention


def main() -> None:
    for num_reqs, seq_len in ((64, 1024), (256, 512), (8, 4096)):
        shape = Shape("decode", num_reqs, 1, seq_len, num_heads=32, num_kv_heads=8)
        query, kv_cache, block_tables, query_start_loc, seq_lens = build(shape)
        scales = torch.tensor([0.01], device="cuda"), torch.tensor([0.01], device="cuda")
        fp8_cache = quantize_kv(kv_cache, scales[0])
        output = torch.empty_like(query)
        cases = [("bf16", kv_cache, None, LaunchConfig())]
        for block_n in (64, 128, 256):
            for num_warps in (4, 8):
                config = LaunchConfig(block_n=block_n, num_warps=num_warps)
                cases.append((f"fp8 n{block_n} w{num_warps}", fp8_cache, scales, config))
        for name, cache, kv_scales, config in cases:
            k_scale, v_scale = kv_scales if kv_scales else (None, None)

            run = functools.partial(
                paged_attention,
                query,
                cache,
                block_tables,
                query_start_loc,
                seq_lens,
                max_query_len=1,
                scale=0.088,
                output=output,
                config=config,
                k_scale=k_scale,
                v_scale=v_scale,
            )
            try:
                ms = time_in_graph(run)
            except Exception as error:  # noqa: BLE001 (a config that does not compile is a row)
                print(json.dumps({"case": name, "error": str(error).splitlines()[0][:120]}))
                continue
            cache_bytes = cache.element_size() * 2 * num_reqs * seq_len * 8 * 128
            print(
                json.dumps(
                    {
                        "num_reqs": num_reqs,
                        "seq_len": seq_len,
                        "case": name,
                        "ms": round(ms, 4),
                        "cache_gb_per_s": round(cache_bytes / ms / 1e6, 1),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
