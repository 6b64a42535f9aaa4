"""The engine's prefill attention path on fresh prompts against cuDNN SDPA (issue 8, item 7).

    PYTHONPATH=src python scripts/fresh_prefill_bench.py [--out DIR]

Times TritonAttentionBackend.forward (what a layer of an eager step calls: the cache write, then
attention; one long fresh prompt goes to SDPA, attention/fresh_prefill.py) and the paged kernel
alone, on the same data as the SDPA peers of benchmarks/attention_bench.py (4 x 2048 and 1 x 8192
fresh prompts, Qwen3-0.6B heads; 4 x 2048 with the Llama-3.1-8B's too), do_bench medians. Also the
relative difference of the backend and the paged kernel, and the kernel's error against fp32 math
SDPA. Writes fresh_prefill.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

from ladle.attention.metadata import AttentionMetadata
from ladle.attention.triton_backend import TritonAttentionBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from attention_bench import Shape, build, check_against_peer, sdpa_peers, time_paged  # noqa: E402

SHAPES = [
    Shape("prefill 4x2048", 4, 2048, 2048),
    Shape("prefill 1x8192", 1, 8192, 8192),
    Shape("prefill 4x2048 8B heads", 4, 2048, 2048, num_heads=32, num_kv_heads=8),
]


def backend_case(shape: Shape) -> dict:
    query, kv_cache, block_tables, query_start_loc, seq_lens = build(shape)
    num_tokens = query.shape[0]
    key = torch.randn(
        num_tokens, shape.num_kv_heads, shape.head_dim, dtype=shape.dtype, device="cuda"
    )
    value = torch.randn_like(key)
    # Each request's keys go to its own blocks, as the runner's slot mapping sends them.
    positions = torch.arange(shape.seq_len, device="cuda")
    slots = block_tables.long()[:, positions // shape.block_size] * shape.block_size
    slot_mapping = (slots + positions % shape.block_size).reshape(-1)
    starts = list(range(0, num_tokens + 1, shape.query_len))
    metadata = AttentionMetadata(
        slot_mapping=slot_mapping,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        max_query_len=shape.query_len,
        max_seq_len=shape.seq_len,
        block_size=shape.block_size,
        query_start_loc_host=starts,
        seq_lens_host=[shape.seq_len] * shape.num_reqs,
    )
    backend = TritonAttentionBackend()
    scale = shape.head_dim**-0.5

    def run():
        return backend.forward(query, key, value, kv_cache, metadata, scale)

    run()
    backend_ms = do_bench(run, warmup=25, rep=200, return_mode="median")
    # The cache now holds these keys: the paged kernel and the peers read the same data.
    paged_ms = time_paged(query, kv_cache, block_tables, query_start_loc, seq_lens, shape, None)
    paged_error = check_against_peer(
        query, kv_cache, block_tables, query_start_loc, seq_lens, shape
    )
    from ladle.kernels.paged_attention import paged_attention

    paged = paged_attention(
        query,
        kv_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        max_query_len=shape.query_len,
        scale=scale,
    ).float()
    output = run().float()
    backend_vs_paged = ((output - paged).norm() / paged.norm()).item()
    peers = sdpa_peers(query, kv_cache, block_tables, shape)
    cudnn = peers.get("cudnn_attention")
    return {
        "shape": shape.name,
        "backend_us": backend_ms * 1e3,
        "paged_kernel_us": paged_ms * 1e3,
        "peers_us": {k: v * 1e3 if isinstance(v, float) else v for k, v in peers.items()},
        "backend_over_cudnn": backend_ms / cudnn if isinstance(cudnn, float) else None,
        "paged_over_cudnn": paged_ms / cudnn if isinstance(cudnn, float) else None,
        "paged_rel_error_vs_fp32": paged_error,
        "backend_rel_diff_vs_paged": backend_vs_paged,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    torch.manual_seed(0)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for shape in SHAPES:
        case = backend_case(shape)
        results["cases"].append(case)
        print(json.dumps(case), flush=True)
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "fresh_prefill.json"), "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
