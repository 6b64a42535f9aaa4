"""The fused kernels against the torch code they replace, on the GPU: per-kernel and per-decoder-
layer time and launches, the sampler, and the prefill attention against cuDNN / flash SDPA.

    PYTHONPATH=src python benchmarks/kernel_bench.py [--out DIR] [--no-sweep]

Each case is timed both ways in the same process, interleaved, as CUDA-graph replays (GPU time
without launch gaps) and eagerly (what a prefill or mixed step pays, launches included); medians
of triton.testing.do_bench. Inputs are random, never zeros.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch
from attention_bench import (
    Shape,
    build,
    flops,
    sdpa_peers,
    time_in_graph,
    time_paged,
)
from triton.testing import do_bench

from ladle.kernels.dispatch import set_fused_kernels
from ladle.kernels.paged_attention import LaunchConfig


def both_ways(fn) -> dict[str, float]:
    """{torch,fused}_{graph,eager}_us for fn with the fused kernels off and on."""
    results = {}
    for _ in range(2):  # interleaved: torch, fused, torch, fused; keep each one's best median
        for name, enabled in (("torch", False), ("fused", True)):
            set_fused_kernels(enabled)
            graph_us = time_in_graph(fn, warmup_ms=10, repeat_ms=60) * 1e3
            eager_us = do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3
            for key, value in ((f"{name}_graph_us", graph_us), (f"{name}_eager_us", eager_us)):
                results[key] = min(results.get(key, float("inf")), value)
    set_fused_kernels(True)
    return results


def count_launches(fn, enabled: bool) -> int:
    """Kernels launched by one call of fn, from the torch profiler."""
    from torch.profiler import ProfilerActivity, profile

    set_fused_kernels(enabled)
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        fn()
        torch.cuda.synchronize()
    set_fused_kernels(True)
    return sum(
        1
        for event in profiler.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
        and not event.name.startswith("Memcpy")
    )


def layer_cases(num_tokens: int):
    """The layer-level ops of one Qwen3-0.6B decoder layer (bf16), each as a closure."""
    from ladle.model.layers.activation import SiluAndMul
    from ladle.model.layers.norm import RMSNorm
    from ladle.model.layers.rotary import RotaryEmbedding

    hidden, heads, kv_heads, head_dim, inter = 1024, 16, 8, 128, 3072
    with torch.device("cuda"):
        norm = RMSNorm(hidden).bfloat16()
        head_norm = RMSNorm(head_dim).bfloat16()
        norm.weight.data.uniform_(0.5, 1.5)
        head_norm.weight.data.uniform_(0.5, 1.5)
        rotary = RotaryEmbedding(head_dim, 40960, 1e6).bfloat16()
        x = torch.randn(num_tokens, hidden).bfloat16()
        residual = torch.randn(num_tokens, hidden).bfloat16()
        qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim).bfloat16()
        positions = torch.randint(0, 4096, (num_tokens,))
        gate_up = torch.randn(num_tokens, 2 * inter).bfloat16()
    query = qkv[:, : heads * head_dim].view(num_tokens, heads, head_dim)
    key = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(num_tokens, kv_heads, -1)
    act = SiluAndMul()
    return {
        "add+rmsnorm": lambda: norm(x, residual),
        "q/k norm (2 calls)": lambda: (head_norm(query), head_norm(key)),
        "rotary q+k": lambda: rotary(positions, query, key),
        "silu*mul": lambda: act(gate_up),
    }


def build_layer(num_reqs: int, query_len: int, context: int):
    """One Qwen3-0.6B decoder layer (random bf16 weights, Triton attention) and its step inputs."""
    from ladle.attention.metadata import AttentionMetadata
    from ladle.attention.triton_backend import TritonAttentionBackend
    from ladle.model.arch_config import ModelArchConfig
    from ladle.model.layers.rotary import RotaryEmbedding
    from ladle.model.loader.presets import PRESETS
    from ladle.model.models.llama import LlamaDecoderLayer

    config = ModelArchConfig.from_hf_dict(PRESETS["qwen3-0.6b"])
    block_size = 16
    with torch.device("cuda"):
        rotary = RotaryEmbedding(config.head_dim, config.max_position_embeddings, config.rope_theta)
        layer = LlamaDecoderLayer(config, rotary, TritonAttentionBackend())
        for name, param in layer.named_parameters():
            if name.endswith("norm.weight"):
                param.data.uniform_(0.5, 1.5)
            else:
                param.data.normal_(0.0, 0.02)
        layer = layer.bfloat16()
        rotary.bfloat16()
        blocks_per_req = -(-context // block_size)
        num_blocks = num_reqs * blocks_per_req + 1
        kv_cache = torch.randn(
            2, num_blocks, block_size, config.num_key_value_heads, config.head_dim
        ).bfloat16()
        block_tables = (torch.randperm(num_blocks - 1) + 1).int().view(num_reqs, blocks_per_req)
        num_tokens = num_reqs * query_len
        first = context - query_len
        token_positions = torch.arange(first, context).repeat(num_reqs)
        request_of_token = torch.arange(num_reqs).repeat_interleave(query_len)
        slot_mapping = (
            block_tables[request_of_token, token_positions // block_size].long() * block_size
            + token_positions % block_size
        )
        query_start_loc = torch.arange(0, num_tokens + 1, query_len, dtype=torch.int32)
        seq_lens = torch.full((num_reqs,), context, dtype=torch.int32)
        hidden = torch.randn(num_tokens, config.hidden_size).bfloat16()
        residual = torch.randn(num_tokens, config.hidden_size).bfloat16()
    metadata = AttentionMetadata(
        slot_mapping=slot_mapping,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        max_query_len=query_len,
        max_seq_len=context,
        block_size=block_size,
        query_start_loc_host=query_start_loc.tolist(),
        seq_lens_host=seq_lens.tolist(),
    )

    def run():
        with torch.no_grad():
            return layer(token_positions, hidden, residual, kv_cache, metadata)

    return run


def sampler_cases(num_reqs: int, vocab_size: int):
    from ladle import SamplingParams
    from ladle.sample.metadata import build_sampling_metadata
    from ladle.sample.sampler import Sampler

    logits = torch.randn(num_reqs, vocab_size, device="cuda") * 3
    sampler = Sampler()
    cases = {
        "temperature 0.6": dict(temperature=0.6),
        "top_k 50": dict(temperature=0.6, top_k=50),
        "top_p 0.9": dict(temperature=0.6, top_p=0.9),
        "min_p 0.05": dict(temperature=0.6, min_p=0.05),
        "greedy": dict(temperature=0.0),
        "penalties": dict(temperature=0.6, presence_penalty=0.5, repetition_penalty=1.1),
    }
    runs = {}
    rows = range(num_reqs)
    for name, params in cases.items():
        metadata = build_sampling_metadata(
            [SamplingParams(**params, seed=row) for row in range(num_reqs)],
            seeds=list(range(num_reqs)),
            num_output_tokens=[0] * num_reqs,
            vocab_size=vocab_size,
            prompt_token_ids=[[(row * 31 + i) % vocab_size for i in range(512)] for row in rows],
            output_token_ids=[[(row * 17 + i) % vocab_size for i in range(256)] for row in rows],
            device="cuda",
        )
        runs[name] = lambda metadata=metadata: sampler(logits, metadata)
    return runs


PREFILL_SWEEP = [LaunchConfig()] + [
    LaunchConfig(block_rows=rows, block_n=block_n, num_warps=warps, num_stages=stages)
    for rows, block_n, warps, stages in [
        (64, 128, 4, 2),
        (128, 64, 8, 2),
        (128, 64, 8, 3),
        (128, 128, 8, 2),
        (128, 128, 8, 3),
        (256, 64, 8, 2),
        (256, 128, 16, 2),
    ]
]


def prefill_attention(sweep: bool) -> list[dict]:
    rows = []
    for shape in (Shape("prefill 4x2048", 4, 2048, 2048), Shape("prefill 1x8192", 1, 8192, 8192)):
        inputs = build(shape)
        peers = sdpa_peers(inputs[0], inputs[1], inputs[2], shape)
        configs = PREFILL_SWEEP if sweep and shape.num_reqs == 4 else PREFILL_SWEEP[:1]
        for config in configs:
            try:
                ms = time_paged(*inputs, shape, config)
            except Exception as error:  # noqa: BLE001 (a tile too large for shared memory)
                rows.append(
                    {"case": shape.name, "config": asdict(config), "error": str(error)[:90]}
                )
                continue
            cudnn = peers.get("cudnn_attention")
            rows.append(
                {
                    "case": shape.name,
                    "config": asdict(config),
                    "us": ms * 1e3,
                    "tflops": flops(shape) / ms / 1e9,
                    "cudnn_us": cudnn * 1e3 if isinstance(cudnn, float) else None,
                    "flash_us": peers["flash_attention"] * 1e3
                    if isinstance(peers.get("flash_attention"), float)
                    else None,
                    "ratio_to_cudnn": ms / cudnn if isinstance(cudnn, float) else None,
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write kernel_bench.json here")
    parser.add_argument("--no-sweep", action="store_true", help="prefill attention defaults only")
    args = parser.parse_args()
    torch.manual_seed(0)
    results: dict = {"device": torch.cuda.get_device_name(), "ops": [], "layers": []}

    for num_tokens in (1, 256, 2048):
        for name, fn in layer_cases(num_tokens).items():
            row = {"op": name, "tokens": num_tokens, **both_ways(fn)}
            row["launches_torch"] = count_launches(fn, False)
            row["launches_fused"] = count_launches(fn, True)
            results["ops"].append(row)
    for name, (num_reqs, query_len, context) in {
        "decode 256 x ctx 512": (256, 1, 512),
        "decode 1 x ctx 512": (1, 1, 512),
        "prefill 4 x 512": (4, 512, 512),
    }.items():
        run = build_layer(num_reqs, query_len, context)
        row = {"layer": name, **both_ways(run)}
        row["launches_torch"] = count_launches(run, False)
        row["launches_fused"] = count_launches(run, True)
        results["layers"].append(row)
    results["sampler"] = []
    for num_reqs in (1, 256):
        for name, fn in sampler_cases(num_reqs, 151936).items():
            row = {"case": name, "reqs": num_reqs, **both_ways(fn)}
            row["launches_torch"] = count_launches(fn, False)
            row["launches_fused"] = count_launches(fn, True)
            results["sampler"].append(row)
    results["prefill_attention"] = prefill_attention(not args.no_sweep)

    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "kernel_bench.json").write_text(json.dumps(results, indent=1))
    header = "torch graph / fused graph us | torch eager / fused eager us | launches"
    print(f"\n{results['device']}\nops: {header}")
    for row in results["ops"] + results["layers"] + results["sampler"]:
        label = row.get("op") or row.get("layer") or f"sampler {row['case']}"
        size = row.get("tokens", row.get("reqs", ""))
        print(
            f"{label:28s} {size!s:>5} | "
            f"{row['torch_graph_us']:9.1f} {row['fused_graph_us']:9.1f} | "
            f"{row['torch_eager_us']:9.1f} {row['fused_eager_us']:9.1f} | "
            f"{row['launches_torch']:4d} -> {row['launches_fused']:4d}"
        )
    print("prefill attention: us, ratio to cuDNN")
    for row in results["prefill_attention"]:
        if "us" in row:
            cfg = {k: v for k, v in row["config"].items() if v is not None}
            print(
                f"{row['case']} {cfg} {row['us']:.1f} us {row['tflops']:.0f} TF/s "
                f"cudnn {row['cudnn_us']} flash {row['flash_us']} ratio {row['ratio_to_cudnn']:.2f}"
            )
        else:
            print(row)


if __name__ == "__main__":
    main()
