"""Decode attention over a bf16 vs a float8 paged cache on the 8B shape (32 heads, 8 kv heads,
head_dim 128): milliseconds per call in a CUDA graph and the effective bandwidth over the cache
bytes, for a few launch configs of the fp8 path (t12k's round; prints one JSON line per case)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import torch

from ladle.attention.kv_quant import quantize_kv
from ladle.kernels.paged_attention import LaunchConfig, choose_num_splits, paged_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from attention_bench import Shape, build, time_in_graph  # noqa: E402

SHAPES_8B = ((64, 1024), (256, 512), (8, 4096))
# --wide: W2's batches and contexts (8B heads), W3's one sequence, and the 0.6B's heads (W1/S1).
WIDE_SHAPES = (
    (64, 1024, 32),
    (256, 512, 32),
    (256, 1024, 32),
    (128, 768, 32),
    (8, 4096, 32),
    (1, 768, 32),
    (256, 512, 16),
)


def main() -> None:
    import sys

    wide = "--wide" in sys.argv
    shapes = WIDE_SHAPES if wide else tuple((r, s, 32) for r, s in SHAPES_8B)
    for num_reqs, seq_len, num_heads in shapes:
        shape = Shape("decode", num_reqs, 1, seq_len, num_heads=num_heads, num_kv_heads=8)
        query, kv_cache, block_tables, query_start_loc, seq_lens = build(shape)
        scales = torch.tensor([0.01], device="cuda"), torch.tensor([0.01], device="cuda")
        fp8_cache = quantize_kv(kv_cache, scales[0])
        output = torch.empty_like(query)
        cases = [
            ("bf16", kv_cache, None, LaunchConfig()),
            ("fp8", fp8_cache, scales, LaunchConfig()),
        ]
        if wide:  # tiles, warps, stages and split factors, both caches
            default_splits = choose_num_splits(num_reqs, 8, query.device)
            splits_options = sorted(
                {default_splits, max(1, default_splits // 2), max(1, default_splits // 4)}
            )
            for label, cache, kv_scales in (("bf16", kv_cache, None), ("fp8", fp8_cache, scales)):
                for block_n in (32, 64, 128):
                    for num_warps in (1, 2, 4):
                        for num_stages in (2, 3):
                            for splits in splits_options:
                                config = LaunchConfig(
                                    block_n=block_n,
                                    num_warps=num_warps,
                                    num_stages=num_stages,
                                    num_splits=splits,
                                )
                                cases.append(
                                    (
                                        f"{label} n{block_n} w{num_warps} s{num_stages} x{splits}",
                                        cache,
                                        kv_scales,
                                        config,
                                    )
                                )
        else:
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
                ms = time_in_graph(run, 10, 60)
            except Exception as error:  # noqa: BLE001 (a config that does not compile is a row)
                print(json.dumps({"case": name, "error": str(error).splitlines()[0][:120]}))
                continue
            cache_bytes = cache.element_size() * 2 * num_reqs * seq_len * 8 * 128
            print(
                json.dumps(
                    {
                        "num_reqs": num_reqs,
                        "seq_len": seq_len,
                        "num_heads": num_heads,
                        "case": name,
                        "ms": round(ms, 4),
                        "cache_gb_per_s": round(cache_bytes / ms / 1e6, 1),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
