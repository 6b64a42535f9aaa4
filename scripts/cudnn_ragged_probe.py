"""Can several fresh prompts go through ONE cuDNN attention call (ragged offsets), and how fast?

    python scripts/cudnn_ragged_probe.py [--json out.json]

torch's `aten._cudnn_attention_forward` takes cumulative sequence offsets (cum_seq_q/k) for
tokens laid out as [total_tokens, heads, head_dim]: the step's own layout. For 4 x 2048 (the
issue-8 item 7 case) and uneven lengths, on the Qwen3-0.6B (16/8 heads) and Llama-3.1-8B (32/8)
heads: its error against per-prompt fp32 math SDPA, its time (do_bench median) with the kv heads
as they are and expanded to the query heads, against the paged Triton kernel and the dense
batched cuDNN SDPA of attention_bench on equal lengths.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from ladle.bench.attention_bench import Shape, build, time_paged

CASES = [
    ("4x2048 0.6B heads", [2048] * 4, 16, 8),
    ("4x2048 8B heads", [2048] * 4, 32, 8),
    ("uneven 0.6B heads", [1500, 2048, 700, 3944], 16, 8),
]


def reference(query, key, value, lengths, scale):
    out = torch.empty_like(query, dtype=torch.float32)
    start = 0
    for length in lengths:
        rows = slice(start, start + length)
        q = query[rows].transpose(0, 1).float().unsqueeze(0)
        k = key[rows].transpose(0, 1).float().unsqueeze(0)
        v = value[rows].transpose(0, 1).float().unsqueeze(0)
        out[rows] = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=True
        )[0].transpose(0, 1)
        start += length
    return out


def ragged(query, key, value, cum, max_len, scale):
    return torch.ops.aten._cudnn_attention_forward(
        query, key, value, None, cum, cum, max_len, max_len, False, 0.0, True, False, scale=scale
    )[0]


def _dense_cudnn(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, lengths, heads, kv_heads in CASES:
        total, dim = sum(lengths), 128
        scale = dim**-0.5
        query = torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16)
        key = torch.randn(total, kv_heads, dim, device="cuda", dtype=torch.bfloat16)
        value = torch.randn_like(key)
        cum = torch.tensor(
            [0] + list(torch.tensor(lengths).cumsum(0)), device="cuda", dtype=torch.int32
        )
        expected = reference(query, key, value, lengths, scale)
        row = {"case": name, "lengths": lengths, "heads": [heads, kv_heads]}
        group = heads // kv_heads
        layouts = {
            "gqa": (key, value),
            "expanded": (
                key.repeat_interleave(group, dim=1),
                value.repeat_interleave(group, dim=1),
            ),
        }
        for label, (k, v) in layouts.items():
            run = functools.partial(ragged, query, k, v, cum, max(lengths), scale)
            try:
                out = run()
                torch.cuda.synchronize()
                error = ((out.float() - expected).norm() / expected.norm()).item()
                us = do_bench(run, warmup=25, rep=200, return_mode="median") * 1000
                row[label] = {"us": round(us, 1), "rel_err": error}
            except Exception as error:  # the op refusing the layout is the finding
                row[label] = {"error": str(error).splitlines()[0][:200]}
        expand = functools.partial(key.repeat_interleave, group, dim=1)
        row["expand_one_us"] = round(do_bench(expand, return_mode="median") * 1000, 1)
        if len(set(lengths)) == 1:
            shape = Shape(
                name, len(lengths), lengths[0], lengths[0], num_heads=heads, num_kv_heads=kv_heads
            )
            q, kv_cache, block_tables, query_start_loc, seq_lens = build(shape)
            row["paged_us"] = round(
                time_paged(q, kv_cache, block_tables, query_start_loc, seq_lens, shape, None)
                * 1000,
                1,
            )
            qd = query.view(len(lengths), lengths[0], heads, dim).transpose(1, 2).contiguous()
            kd = key.view(len(lengths), lengths[0], kv_heads, dim).transpose(1, 2).contiguous()
            vd = value.view(len(lengths), lengths[0], kv_heads, dim).transpose(1, 2).contiguous()
            dense = functools.partial(_dense_cudnn, qd, kd, vd)
            try:
                dense()
                row["dense_cudnn_us"] = round(
                    do_bench(dense, warmup=25, rep=200, return_mode="median") * 1000, 1
                )
            except Exception as error:
                row["dense_cudnn_us"] = str(error)[:100]
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
